#!/usr/bin/env python3
"""llama.cpp side of `kamera bench model --against llama.cpp`: the same GGUF, the same filler
text and the same measurements as `kamera bench model` (best of --reps prefills of N tokens from
an empty cache, logits at the last position; greedy decode of --decode tokens after a
--decode-after-token prompt), through llama-cpp-python built from source (scripts/llamacpp-venv.sh).
llama.cpp runs as at its best: flash attention on (upstream's default is auto; the Python
binding's is off), ggml's extra CPU buffer types (AMX, REPACK) on. Greedy decode reads the last
token's logits from the context (`Llama.scores` stays unfilled without logits_all).
Prints one JSON line with tokens/s and peak resident memory (VmHWM) of this process.
With --golden FILE (crates/kamera-model/tests/golden/<model>.json, HF transformers' logits on the
same prompts) it times nothing: it prints llama.cpp's KL to those logits at every position of
the prompts, over the reference's top-K plus one tail bucket (kamera_model::bucketed_kl).

Usage: python bench_llamacpp.py --gguf FILE [--prefill 512,2048] [--decode 64] [--decode-after 128]
                                [--reps 2] [--threads 2] [--no-extra-bufts] [--no-flash-attn]
       python bench_llamacpp.py --gguf FILE --golden FILE [--threads 2]
"""
import argparse
import json
import sys
import time

TEXT = "The quick brown fox jumps over the lazy dog while the farmer counts sheep in the valley. "


def status_mb(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--prefill", default="512,2048")
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--decode-after", type=int, default=128)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-extra-bufts", action="store_true",
                    help="load without ggml's extra CPU buffer types (AMX, REPACK)")
    ap.add_argument("--no-flash-attn", action="store_true", help="flash attention off")
    ap.add_argument("--golden", help="score against this golden logits file instead of timing")
    args = ap.parse_args()
    if args.golden:
        return golden_score(args)
    import numpy as np
    import llama_cpp
    import llama_cpp.llama

    if args.no_extra_bufts:
        default_params = llama_cpp.llama_model_default_params

        def params():
            p = default_params()
            p.use_extra_bufts = False
            return p

        llama_cpp.llama.llama_cpp.llama_model_default_params = params

    lengths = [int(x) for x in args.prefill.split(",") if x]
    n_ctx = max(lengths + [args.decode_after + args.decode]) + 16
    base_mb = status_mb("VmRSS")
    llm = llama_cpp.Llama(
        model_path=args.gguf,
        n_ctx=n_ctx,
        n_threads=args.threads,
        n_threads_batch=args.threads,
        n_batch=512,
        flash_attn=not args.no_flash_attn,
        verbose=False,
    )
    n_vocab = llm.n_vocab()

    def last_logits():
        # The logits of the batch's last token (the only row computed without logits_all).
        return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(n_vocab,))
    base = llm.tokenize(TEXT.encode(), add_bos=False, special=False)

    def filler(n):
        ids = []
        while len(ids) < n:
            ids += base
        return ids[:n]

    results = {}
    for n in lengths:
        ids = filler(n)
        best = float("inf")
        for _ in range(max(1, args.reps)):
            llm.reset()  # n_tokens = 0: the next eval drops the whole KV cache
            t = time.perf_counter()
            llm.eval(ids)
            best = min(best, time.perf_counter() - t)
        results[f"prefill_{n}_tok_s"] = n / best
    if args.decode > 0:
        llm.reset()
        llm.eval(filler(max(1, args.decode_after)))
        nxt = int(np.argmax(last_logits()))
        t = time.perf_counter()
        for _ in range(args.decode):
            llm.eval([nxt])
            nxt = int(np.argmax(last_logits()))
        key = "decode" if args.decode_after == 128 else f"decode_{args.decode_after}"
        results[f"{key}_tok_s"] = args.decode / (time.perf_counter() - t)
    print(json.dumps({
        "engine": "llama.cpp",
        "version": llama_cpp.__version__,
        "gguf": args.gguf,
        "threads": args.threads,
        "extra_bufts": not args.no_extra_bufts,
        "flash_attn": not args.no_flash_attn,
        "results": results,
        "peak_rss_mb": status_mb("VmHWM"),
        "rss_mb": status_mb("VmRSS"),
        "baseline_rss_mb": base_mb,
    }))
    return 0


def golden_score(args) -> int:
    """KL(reference || llama.cpp) per position, bucketed as kamera_model::bucketed_kl does."""
    import numpy as np
    import llama_cpp

    with open(args.golden) as f:
        golden = json.load(f)
    cases = golden["cases"]
    llm = llama_cpp.Llama(
        model_path=args.gguf,
        n_ctx=max(len(c["ids"]) for c in cases) + 16,
        n_threads=args.threads,
        n_threads_batch=args.threads,
        flash_attn=not args.no_flash_attn,
        logits_all=True,
        verbose=False,
    )
    kls, top1, last_ok = [], 0, True
    for c in cases:
        ids = c["ids"]
        llm.reset()
        llm.eval(ids)
        rows = np.asarray(llm.scores[: len(ids)], dtype=np.float64)
        for t, row in enumerate(rows):
            m = row.max()
            lq_all = row - (m + np.log(np.exp(row - m).sum()))
            top = np.asarray(c["top_ids"][t])
            lp = np.asarray(c["top_logits"][t]) - c["lse"][t]
            lq = lq_all[top]
            kl = float((np.exp(lp) * (lp - lq)).sum())
            pt = max(1.0 - float(np.exp(lp).sum()), 1e-30)
            qt = max(1.0 - float(np.exp(lq).sum()), 1e-30)
            kls.append(max(kl + pt * np.log(pt / qt), 0.0))
            equal = int(np.argmax(row)) == int(top[0])
            top1 += equal
            if t + 1 == len(ids):
                last_ok &= equal
    print(json.dumps({
        "engine": "llama.cpp",
        "golden": {
            "mean_kl": float(np.mean(kls)),
            "max_kl": float(np.max(kls)),
            "top1_equal": top1,
            "positions": len(kls),
            "last_top1_equal": bool(last_ok),
        },
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
