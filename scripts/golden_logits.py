#!/usr/bin/env python3
"""Golden logits for kamera-model parity tests, from an independent implementation:
HF transformers + torch (CPU, float32) loading the same GGUF files that `kamera models fetch`
caches. Writes crates/kamera-model/tests/golden/<model>.json.

Setup: pip install torch transformers accelerate gguf numpy sentencepiece protobuf
Usage: python3 scripts/golden_logits.py [--home ~/.cache/kamera] [--top 32] [model ...]

Per prompt it stores the token ids the HF tokenizer produces (its default: BOS only where the
model adds it) and, for every position, the top-K token ids and logits plus the logsumexp of the
full row, so the Rust test can compute a bucketed KL (top-K + one tail bucket) and top-1 match.
"""
import argparse
import json
import os
import sys
from pathlib import Path

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "Alice gave Bob a red apple. Bob put the apple in the basket. What colour is the apple in the basket? It is",
]
MODELS = ["smollm2-135m", "qwen2.5-0.5b", "gemma3-270m"]
# Tokenizer-only goldens (tests/golden/tokenizer.json): whitespace runs, unicode, digits, specials.
TOKENIZER_STRINGS = [
    "Hello  world!\n\n\tTabs and   spaces",
    "naïve café — “quotes” 😀 中文字符 日本語",
    "x=1234567;y=3.14e-10 // CAPS'll we've",
    "  leading spaces",
    "trailing\n",
    "<|im_start|>user\nhi<|im_end|>",
    "<start_of_turn>user\nhi<end_of_turn>",
    "a\r\nb\u00a0c",
    "ÀÉÎõü ß ﬁ",
]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--home", default=os.environ.get("KAMERA_HOME", str(Path.home() / ".cache" / "kamera")))
    ap.add_argument("--top", type=int, default=32)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent.parent / "crates/kamera-model/tests/golden"))
    ap.add_argument("models", nargs="*", default=MODELS)
    args = ap.parse_args()
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as e:
        print(f"missing python package ({e}); run: pip install torch transformers accelerate gguf numpy sentencepiece protobuf", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok_golden = {}
    for name in args.models:
        path = Path(args.home) / "models" / f"{name}.gguf"
        if not path.exists():
            print(f"{path} missing: run `kamera models fetch {name}` first", file=sys.stderr)
            return 2
        tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        tok_golden[name] = [{"text": t, "ids": tok(t)["input_ids"]} for t in TOKENIZER_STRINGS]
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
        model.eval()
        cases = []
        for prompt in PROMPTS:
            ids = tok(prompt)["input_ids"]
            with torch.no_grad():
                logits = model(torch.tensor([ids])).logits[0].double()
            lse = torch.logsumexp(logits, dim=-1)
            top = torch.topk(logits, args.top, dim=-1)
            cases.append({
                "prompt": prompt,
                "ids": ids,
                "lse": [round(float(x), 6) for x in lse],
                "top_ids": top.indices.tolist(),
                "top_logits": [[round(float(x), 5) for x in row] for row in top.values],
            })
            print(f"{name}: {len(ids)} tokens, next {top.indices[-1, :5].tolist()}", file=sys.stderr)
        import transformers
        doc = {
            "model": name,
            "source": f"transformers {transformers.__version__}, torch {torch.__version__}, float32, GGUF dequantized by gguf-py",
            "cases": cases,
        }
        (out_dir / f"{name}.json").write_text(json.dumps(doc) + "\n")
    (out_dir / "tokenizer.json").write_text(json.dumps(tok_golden, ensure_ascii=False, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
