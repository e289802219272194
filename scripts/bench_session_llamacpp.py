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

A step server, so that the bench times every method at the same step back to back (paired under
the same machine load): it loads the model once per method (and once more for the reference),
prints {"ready": true, "n_vocab": N} and then reads one JSON step per line on stdin,
  {"window": [tok...], "radix": [tok...], "drop": [p0, n] | null}
runs the prompt cache on "window", the context shift on "radix", and each sequence from an empty
cache (llama.cpp's own full re-prefill, untimed, for a KL free of the difference between the
engines), writes the four next-token logit vectors as float32 little-endian to --out/step.f32
(prompt cache, context shift, full window, full radix), and answers one JSON line with the step's
timings. At end of input it prints one JSON line with the engine's details.
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
    ap.add_argument("--out", required=True)
    ap.add_argument("--n-ctx", type=int, required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cache-bytes", type=int, default=2 << 30)
    args = ap.parse_args()
    import llama_cpp

    def load():
        return llama_cpp.Llama(
            model_path=args.gguf,
            n_ctx=args.n_ctx,
            n_threads=args.threads,
            n_threads_batch=args.threads,
            n_batch=512,
            flash_attn=True,
            verbose=False,
        )

    os.makedirs(args.out, exist_ok=True)
    pc, cs, ref = load(), load(), load()
    n_vocab = pc.n_vocab()

    def last_logits(m):
        ptr = llama_cpp.llama_get_logits_ith(m._ctx.ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(n_vocab,)).astype(np.float32, copy=True)

    # (a) The RAM prompt cache, through create_completion. The first sample marks the first token:
    # `sample` is wrapped to note when it is called and to copy the logits it samples from.
    pc.set_cache(llama_cpp.LlamaRAMCache(capacity_bytes=args.cache_bytes))
    seen = {}
    orig_sample = pc.sample

    def sample(*a, **kw):
        t = time.perf_counter()
        seen["logits"] = last_logits(pc)
        t1 = time.perf_counter()
        tok = orig_sample(*a, **kw)
        seen["ready"] = t + (time.perf_counter() - t1)
        return tok

    pc.sample = sample

    def prompt_cache(seq):
        before = lcp(pc._input_ids.tolist(), seq) if pc.n_tokens > 0 else 0
        seen.clear()
        t0 = time.perf_counter()
        pc.create_completion(prompt=seq, max_tokens=1, temperature=0.0, top_k=1, repeat_penalty=1.0)
        t_end = time.perf_counter()
        return seen["logits"], {
            "ttft_ms": (seen["ready"] - t0) * 1e3,
            "work_ms": (t_end - t0) * 1e3,
            "live_prefix": before,
            "cache_entries": len(pc.cache.cache_state),
            "cache_bytes": pc.cache.cache_size,
        }

    # (b) Context shift on one sequence.
    mem = llama_cpp.llama_get_memory(cs._ctx.ctx)
    cur = []

    def context_shift(seq, drop):
        nonlocal cur
        t0 = time.perf_counter()
        shifted = 0
        if drop:
            p0, n = drop
            if n > 0 and len(cur) >= p0 + n:
                llama_cpp.llama_memory_seq_rm(mem, 0, p0, p0 + n)
                llama_cpp.llama_memory_seq_add(mem, 0, p0 + n, -1, -n)
                cur = cur[:p0] + cur[p0 + n:]
                shifted = n
        keep = min(lcp(cur, seq), len(seq) - 1)
        cs.n_tokens = keep
        cs.input_ids[:keep] = cur[:keep]
        cs.eval(seq[keep:])  # removes cells from `keep` on, then decodes the rest
        logits = last_logits(cs)
        t1 = time.perf_counter()
        cur = list(seq)
        return logits, {
            "ttft_ms": (t1 - t0) * 1e3,
            "work_ms": (t1 - t0) * 1e3,
            "reused": keep,
            "prefilled": len(seq) - keep,
            "shifted": shifted,
        }

    def full(seq):
        ref.reset()
        ref.eval(seq)
        return last_logits(ref)

    print(json.dumps({"ready": True, "n_vocab": n_vocab}), flush=True)
    path = os.path.join(args.out, "step.f32")
    for line in sys.stdin:
        if not line.strip():
            continue
        s = json.loads(line)
        pc_logits, pc_row = prompt_cache(s["window"])
        cs_logits, cs_row = context_shift(s["radix"], s.get("drop"))
        np.stack([pc_logits, cs_logits, full(s["window"]), full(s["radix"])]).tofile(path)
        print(json.dumps({"prompt_cache": pc_row, "context_shift": cs_row}), flush=True)

    print(json.dumps({
        "engine": "llama.cpp",
        "version": llama_cpp.__version__,
        "system_info": llama_cpp.llama_print_system_info().decode(errors="replace").strip(),
        "threads": args.threads,
        "n_ctx": args.n_ctx,
        "n_vocab": n_vocab,
        "flash_attn": True,
        "cache_bytes": args.cache_bytes,
        "reference": True,
    }), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
