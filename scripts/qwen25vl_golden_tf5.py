#!/usr/bin/env python3
"""A second tiny seeded random-weight Qwen2.5-VL, saved by HF transformers 5, and its goldens.

transformers 5 writes another config layout than 4.x: `text_config.rope_parameters`
{rope_type, rope_theta, mrope_section} and no `rope_scaling` / top-level `rope_theta`. This
checkpoint is saved by transformers 5 itself, with a geometry the 4.x one does not have (three
vision blocks, full attention in the last; M-RoPE sections [2, 2, 4]; rotary base 5e5, not the
1e6 a silent default would give; tied input and output embeddings), so that loading it and
matching its logits checks the 5.x layout end to end. The tokenizer and images are those of
scripts/qwen25vl_golden.py (same seed). Writes, under crates/kamera-model/tests/golden/:

  qwen25vl-tiny-tf5/     the checkpoint as transformers 5 saves it
  qwen25vl-golden-tf5/   golden.safetensors (pixel values, grids, merged image embeddings, input
                         ids, 3-D position ids, logits at every position) and golden.json

Setup (once; pinned): transformers 5 beside the 4.x venv's torch:
  ~/.cache/kamera/venv-vl/bin/pip install --target ~/.cache/kamera/tf5-site transformers==5.25.0
Usage: PYTHONPATH=~/.cache/kamera/tf5-site ~/.cache/kamera/venv-vl/bin/python scripts/qwen25vl_golden_tf5.py
"""
import json
import sys
from pathlib import Path

import torch
import transformers
from PIL import Image
from safetensors.torch import save_file
from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from qwen25vl_golden import (  # noqa: E402
    PROMPT_IMAGES,
    PROMPTS,
    ROOT,
    SEED,
    SPECIALS,
    expand,
    make_images,
    make_tokenizer,
    randomize,
    save_checkpoint,
    special_ids,
    vision_config,
)

MODEL_DIR = ROOT / "qwen25vl-tiny-tf5"
GOLDEN_DIR = ROOT / "qwen25vl-golden-tf5"
ROPE_THETA = 500_000.0


def main() -> None:
    if not transformers.__version__.startswith("5."):
        sys.exit(f"transformers 5 is needed, found {transformers.__version__}")
    torch.manual_seed(SEED + 5)
    tokenizer = make_tokenizer()
    ids = {s: tokenizer.convert_tokens_to_ids(s) for s in SPECIALS}
    vocab = len(tokenizer)
    cfg = Qwen2_5_VLConfig(
        text_config=dict(
            vocab_size=vocab,
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=1,
            rms_norm_eps=1e-6,
            max_position_embeddings=4096,
            tie_word_embeddings=True,
            rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA, "mrope_section": [2, 2, 4]},
        ),
        vision_config=vision_config(depth=3, intermediate_size=96, fullatt_block_indexes=[2]),
        **special_ids(ids),
        tie_word_embeddings=True,
        attn_implementation="eager",
    )
    model = Qwen2_5_VLForConditionalGeneration(cfg).eval()
    randomize(model)
    processor = Qwen2VLImageProcessorPil(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 16)
    save_checkpoint(model, tokenizer, processor, MODEL_DIR, GOLDEN_DIR)
    saved = json.loads((MODEL_DIR / "config.json").read_text())
    text = saved.get("text_config", saved)
    assert "rope_parameters" in text and "rope_scaling" not in text, "not the transformers 5 layout"

    tensors: dict = {}
    meta: dict = {
        "seed": SEED + 5,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "images": {},
        "prompts": {},
    }
    with torch.no_grad():
        for name, img in make_images().items():
            img.save(GOLDEN_DIR / f"{name}.png")
            reloaded = Image.open(GOLDEN_DIR / f"{name}.png").convert("RGB")
            p = processor(images=[reloaded], return_tensors="pt")
            pv, grid = p["pixel_values"].float(), p["image_grid_thw"]
            tensors[f"{name}.pixel_values"] = pv
            tensors[f"{name}.grid_thw"] = grid.to(torch.int64)
            out = model.model.visual(pv, grid_thw=grid)
            embeds = getattr(out, "pooler_output", out)
            tensors[f"{name}.image_embeds"] = embeds.contiguous()
            meta["images"][name] = {"size": list(img.size), "grid_thw": grid[0].tolist()}

        for pname, text in PROMPTS.items():
            names = PROMPT_IMAGES[pname]
            grids = [tensors[f"{n}.grid_thw"][0] for n in names]
            expanded = expand(text, grids)
            input_ids = torch.tensor([tokenizer(expanded)["input_ids"]])
            kwargs = {}
            if names:
                kwargs["pixel_values"] = torch.cat([tensors[f"{n}.pixel_values"] for n in names])
                kwargs["image_grid_thw"] = torch.stack(grids)
            mm = (input_ids == ids["<|image_pad|>"]).to(torch.int32)
            out = model(input_ids=input_ids, mm_token_type_ids=mm, **kwargs)
            pos, _ = model.model.get_rope_index(input_ids, mm, kwargs.get("image_grid_thw"))
            tensors[f"{pname}.input_ids"] = input_ids[0].to(torch.int64)
            tensors[f"{pname}.position_ids"] = pos[:, 0, :].to(torch.int64).contiguous()
            tensors[f"{pname}.logits"] = out.logits[0].float().contiguous()
            meta["prompts"][pname] = {"text": text, "expanded": expanded, "images": names}

    meta["special_ids"] = ids
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(GOLDEN_DIR / "golden.safetensors"))
    (GOLDEN_DIR / "golden.json").write_text(json.dumps(meta, indent=1, ensure_ascii=False) + "\n")
    total = sum(f.stat().st_size for f in MODEL_DIR.iterdir()) + sum(f.stat().st_size for f in GOLDEN_DIR.iterdir())
    print(f"wrote {MODEL_DIR} and {GOLDEN_DIR} ({total / 1e6:.2f} MB), vocab {vocab}")


if __name__ == "__main__":
    main()
