#!/usr/bin/env python3
"""llama.cpp side of `kamera bench session --against-llamacpp`: the same GGUF, the same token
sequences and the same thread count as the Rust side, through llama-cpp-python built from source
(scripts/llamacpp-venv.sh), flash attention on. Two methods, as llama.cpp's users run them:

  prompt-cache   Llama.create_completion(max_tokens=1, greedy) on each step's sequence (Kamera's
                 window + prompt) with the RAM prompt cache (LlamaRAMCache, llm.set_cache) of
                 --cache-bytes: the longest cached prefix is loaded or kept, the rest evaluated,
                 and the state saved to the cache after the token (that save is work, not TTFT).
  context-shift  one sequence in one context over the transcript layout (pinned prefix, pages
                 appended): when the layout drops the oldest pages after the prefix, their cells
                 are removed and the rest shifted down (llama_memory_seq_rm / seq_add, as
                 llama-server's context shift does), then the longest common prefix with the
                 step's sequence is kept and the rest evaluated.

With --reference, each step's two sequences are also evaluated from an empty cache (llama.cpp's
own full re-prefill, for a KL free of the difference between the engines).

Input (--steps FILE): {"steps": [{"window": [tok...], "radix": [tok...], "drop": [p0, n] | null}]}
Output: next-token logits as float32 little-endian files (steps x n_vocab) in --out:
prompt_cache.f32, context_shift.f32 (and full_window.f32, full_radix.f32 with --reference), and
one JSON line on stdout with per-step timings and token counts.
"""
import argparse
import json
import os
import sys
import time

import numpy as np


def lcp(a, b):
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--steps", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cache-bytes", type=int, default=2 << 30)
    ap.add_argument("--reference", action="store_true")
    args = ap.parse_args()
    import llama_cpp

    with open(args.steps) as f:
        steps = json.load(f)["steps"]
    longest = max(max(len(s["window"]), len(s["radix"])) for s in steps)
    n_ctx = longest + 64

    def load():
        return llama_cpp.Llama(
            model_path=args.gguf,
            n_ctx=n_ctx,
            n_threads=args.threads,
            n_threads_batch=args.threads,
            n_batch=512,
            flash_attn=True,
            verbose=False,
        )

    os.makedirs(args.out, exist_ok=True)
    llm = load()
    n_vocab = llm.n_vocab()

    def last_logits(m):
        ptr = llama_cpp.llama_get_logits_ith(m._ctx.ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(n_vocab,)).astype(np.float32, copy=True)

    # (a) The RAM prompt cache, through create_completion. The first sample marks the first token:
    # `sample` is wrapped to note when it is called and to copy the logits it samples from.
    llm.set_cache(llama_cpp.LlamaRAMCache(capacity_bytes=args.cache_bytes))
    seen = {}
    orig_sample = llm.sample

    def sample(*a, **kw):
        t = time.perf_counter()
        seen["logits"] = last_logits(llm)
        t1 = time.perf_counter()
        tok = orig_sample(*a, **kw)
        seen["ready"] = t + (time.perf_counter() - t1)
        return tok

    llm.sample = sample
    pc_rows, pc_logits = [], []
    for s in steps:
        seq = s["window"]
        before = lcp(llm._input_ids.tolist(), seq) if llm.n_tokens > 0 else 0
        seen.clear()
        t0 = time.perf_counter()
        llm.create_completion(prompt=seq, max_tokens=1, temperature=0.0, top_k=1, repeat_penalty=1.0)
        t_end = time.perf_counter()
        pc_rows.append({
            "ttft_ms": (seen["ready"] - t0) * 1e3,
            "work_ms": (t_end - t0) * 1e3,
            "live_prefix": before,
            "cache_entries": len(llm.cache.cache_state),
            "cache_bytes": llm.cache.cache_size,
        })
        pc_logits.append(seen["logits"])
        print(f"llama.cpp prompt-cache step {len(pc_rows) - 1}: ttft {pc_rows[-1]['ttft_ms']:.0f} ms", file=sys.stderr)
    np.stack(pc_logits).tofile(os.path.join(args.out, "prompt_cache.f32"))
    del llm

    # (b) Context shift on one sequence.
    llm = load()
    mem = llama_cpp.llama_get_memory(llm._ctx.ctx)
    cur = []
    cs_rows, cs_logits = [], []
    for s in steps:
        seq = s["radix"]
        t0 = time.perf_counter()
        shifted = 0
        if s.get("drop"):
            p0, n = s["drop"]
            if n > 0 and len(cur) >= p0 + n:
                llama_cpp.llama_memory_seq_rm(mem, 0, p0, p0 + n)
                llama_cpp.llama_memory_seq_add(mem, 0, p0 + n, -1, -n)
                cur = cur[:p0] + cur[p0 + n:]
                shifted = n
        keep = min(lcp(cur, seq), len(seq) - 1)
        llm.n_tokens = keep
        llm.input_ids[:keep] = cur[:keep]
        llm.eval(seq[keep:])  # removes cells from `keep` on, then decodes the rest
        logits = last_logits(llm)
        t1 = time.perf_counter()
        cur = list(seq)
        cs_rows.append({
            "ttft_ms": (t1 - t0) * 1e3,
            "work_ms": (t1 - t0) * 1e3,
            "reused": keep,
            "prefilled": len(seq) - keep,
            "shifted": shifted,
        })
        cs_logits.append(logits)
        print(f"llama.cpp context-shift step {len(cs_rows) - 1}: ttft {cs_rows[-1]['ttft_ms']:.0f} ms", file=sys.stderr)
    np.stack(cs_logits).tofile(os.path.join(args.out, "context_shift.f32"))

    # Reference: every sequence from an empty cache.
    if args.reference:
        for key, name in (("window", "full_window.f32"), ("radix", "full_radix.f32")):
            out = []
            for s in steps:
                llm.reset()
                llm.eval(s[key])
                out.append(last_logits(llm))
            np.stack(out).tofile(os.path.join(args.out, name))

    print(json.dumps({
        "engine": "llama.cpp",
        "version": llama_cpp.__version__,
        "system_info": llama_cpp.llama_print_system_info().decode(errors="replace").strip(),
        "threads": args.threads,
        "n_ctx": n_ctx,
        "n_vocab": n_vocab,
        "flash_attn": True,
        "cache_bytes": args.cache_bytes,
        "prompt_cache": pc_rows,
        "context_shift": cs_rows,
        "reference": args.reference,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
