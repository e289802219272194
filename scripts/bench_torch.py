#!/usr/bin/env python3
"""Torch side of the kamera-model benchmark: HF transformers + torch (CPU, float32) on the same
GGUF that `kamera models fetch` caches, measured the way `kamera bench model` measures: best of
`--reps` prefills of N filler tokens (logits at the last position only), then greedy decode of
`--decode` tokens after a 128-token prompt with a KV cache. Prints one JSON line.

Usage: python3 scripts/bench_torch.py --model smollm2-135m [--prefill 512,2048] [--decode 64]
"""
import argparse
import json
import os
import sys
import time
from pathlib import Path

TEXT = "The quick brown fox jumps over the lazy dog while the farmer counts sheep in the valley. "


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--home", default=os.environ.get("KAMERA_HOME", str(Path.home() / ".cache" / "kamera")))
    ap.add_argument("--prefill", default="512,2048")
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--reps", type=int, default=2)
    args = ap.parse_args()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(args.home) / "models" / f"{args.model}.gguf"
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    model.eval()
    base = tok(TEXT, add_special_tokens=False)["input_ids"]

    def filler(n):
        ids = []
        while len(ids) < n:
            ids += base
        return torch.tensor([ids[:n]])

    results = {}
    with torch.inference_mode():
        for n in [int(x) for x in args.prefill.split(",") if x]:
            ids = filler(n)
            best = float("inf")
            for _ in range(max(1, args.reps)):
                t = time.perf_counter()
                model(ids, logits_to_keep=1)
                best = min(best, time.perf_counter() - t)
            results[f"prefill_{n}_tok_s"] = n / best
        if args.decode > 0:
            out = model(filler(128), use_cache=True, logits_to_keep=1)
            past = out.past_key_values
            nxt = out.logits[:, -1:].argmax(-1)
            t = time.perf_counter()
            for _ in range(args.decode):
                out = model(nxt, past_key_values=past, use_cache=True)
                past = out.past_key_values
                nxt = out.logits[:, -1:].argmax(-1)
            results["decode_tok_s"] = args.decode / (time.perf_counter() - t)
    print(json.dumps({"model": args.model, "engine": f"torch {torch.__version__} ({torch.get_num_threads()} threads)", "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
