#!/usr/bin/env python3
"""HF transformers' side of `kamera bench vision --against transformers`: Qwen2.5-VL on CPU (torch,
the given dtype and threads, SDPA attention) on the same checkpoint directory and screenshot PNG.

Loads the model and the image processor, prints one JSON line (the grid, the load time), then
serves commands on stdin, one per line, answering each with one JSON line:
  run            preprocess (HF's image processor), the vision tower alone, then tower + prefill of
                 the image chunk (<|vision_start|> image pads <|vision_end|>, a KV cache built, the
                 logits of the last position only), each timed in ms
  logits PATH    the last position's logits of that forward as little-endian f32 to PATH
Setup: scripts/vl-venv.sh (torch + transformers pinned, cached).
"""
import argparse
import json
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--image", required=True)
    ap.add_argument("--max-pixels", type=int, required=True)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--dtype", choices=["bf16", "f32"], required=True)
    args = ap.parse_args()

    import numpy as np
    import torch
    import transformers
    from PIL import Image
    from transformers import Qwen2_5_VLForConditionalGeneration, Qwen2VLImageProcessor

    torch.set_num_threads(args.threads)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    t = time.perf_counter()
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(args.model, dtype=dtype, attn_implementation="sdpa")
    model.eval()
    proc = Qwen2VLImageProcessor.from_pretrained(args.model, max_pixels=args.max_pixels)
    load_s = time.perf_counter() - t
    image = Image.open(args.image).convert("RGB")
    cfg = model.config
    start, pad, end = cfg.vision_start_token_id, cfg.image_token_id, cfg.vision_end_token_id
    merge = cfg.vision_config.spatial_merge_size

    def inputs():
        out = proc(images=[image], return_tensors="pt")
        return out["pixel_values"].to(dtype), out["image_grid_thw"]

    pv, grid = inputs()
    n_img = int(grid.prod()) // (merge * merge)
    ids = torch.tensor([[start] + [pad] * n_img + [end]])
    print(json.dumps({
        "ready": True, "grid": grid[0].tolist(), "image_tokens": n_img, "load_s": load_s,
        "torch": torch.__version__, "transformers": transformers.__version__, "dtype": args.dtype,
        "threads": torch.get_num_threads(),
    }), flush=True)

    last = None
    for line in sys.stdin:
        cmd = line.split()
        if not cmd:
            continue
        if cmd[0] == "run":
            with torch.inference_mode():
                t0 = time.perf_counter()
                pv, grid = inputs()
                t1 = time.perf_counter()
                model.visual(pv, grid_thw=grid)
                t2 = time.perf_counter()
                out = model(input_ids=ids, pixel_values=pv, image_grid_thw=grid, use_cache=True, logits_to_keep=1)
                t3 = time.perf_counter()
            last = out.logits[0, -1].float().numpy()
            print(json.dumps({
                "preprocess_ms": (t1 - t0) * 1e3, "tower_ms": (t2 - t1) * 1e3, "encode_ms": (t3 - t2) * 1e3,
            }), flush=True)
        elif cmd[0] == "logits" and len(cmd) == 2 and last is not None:
            np.asarray(last, dtype="<f4").tofile(cmd[1])
            print(json.dumps({"logits": cmd[1], "n": int(last.shape[0])}), flush=True)
        else:
            print(json.dumps({"error": f"unknown command {line.strip()!r}"}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
