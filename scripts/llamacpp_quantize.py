#!/usr/bin/env python3
"""A GGUF requantized by llama.cpp's own quantize (`llama_model_quantize` through llama-cpp-python,
scripts/llamacpp-venv.sh), as its users make one: the default mix of the target type (llama.cpp
keeps its own choice for the output and embedding matrices), from an already quantized file
(allow_requantize: every matrix is dequantized, then quantized again, so the result carries
both roundings). `kamera bench model --requant TYPE` runs both engines on the result.

Usage: python llamacpp_quantize.py --gguf IN --out OUT --type q4_0|q8_0 [--threads 2]
Writes OUT.partial, then renames it to OUT; prints OUT.
"""
import argparse
import os
import sys

TYPES = {"q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0", "q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0"}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--type", required=True, choices=sorted(TYPES))
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, TYPES[args.type])
    params.allow_requantize = True
    params.nthread = args.threads
    partial = args.out + ".partial"
    rc = llama_cpp.llama_model_quantize(args.gguf.encode(), partial.encode(), params)
    if rc != 0:
        print(f"llama_model_quantize {args.gguf} -> {args.type} failed (return code {rc})", file=sys.stderr)
        return 1
    os.replace(partial, args.out)
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
