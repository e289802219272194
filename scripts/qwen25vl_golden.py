#!/usr/bin/env python3
"""A tiny seeded random-weight Qwen2.5-VL and its goldens, from HF transformers + torch (CPU, f32).

No registry ships pretrained Qwen2.5-VL weights, so kamera-model's Qwen2.5-VL is checked for exact
parity on a small random model of the real architecture: two ViT blocks (one windowed, one with full
attention), the 2x2 patch merger, a two-layer Qwen2 LLM with M-RoPE, and a small byte-level BPE
tokenizer trained here with Qwen2's pre-tokenizer. Writes, under crates/kamera-model/tests/golden/:

  qwen25vl-tiny/         the checkpoint, in the Hugging Face layout a user brings (config.json,
                         sharded safetensors + index, tokenizer.json, preprocessor_config.json)
  qwen25vl-golden/       img*.png (synthetic, seeded), golden.safetensors (pixel values, grids,
                         vision block output, merged image embeddings, input ids, 3-D position
                         ids, logits at every position) and golden.json (prompts, ids, names)

Setup (once; pinned): python3 -m venv ~/.cache/kamera/venv-vl &&
  ~/.cache/kamera/venv-vl/bin/pip install torch==2.9.1 transformers==4.57.6 safetensors pillow numpy
Usage: ~/.cache/kamera/venv-vl/bin/python scripts/qwen25vl_golden.py
"""
import json
import shutil
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from safetensors.torch import save_file
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    PreTrainedTokenizerFast,
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2VLImageProcessor,
)

ROOT = Path(__file__).resolve().parent.parent / "crates/kamera-model/tests/golden"
MODEL_DIR = ROOT / "qwen25vl-tiny"
GOLDEN_DIR = ROOT / "qwen25vl-golden"
SEED = 20261201

# Qwen2's pre-tokenizer split (as in Qwen2.5's tokenizer.json).
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPECIALS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
]
CORPUS = [
    "The order status page lists every order with its id, its date and whether it shipped.",
    "Click the button labelled Submit, then type the name into the search field and press Enter.",
    "A web agent reads the screenshot, finds the link and clicks it; the page changes.",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "Describe this image. What colour is the square in the top left corner? It is red.",
    "numbers 0123456789, punctuation !?.,;:'\"()[]{}<>/\\|@#$%^&*-+=_~` and CAPS'll we've",
    "naïve café — “quotes” 中文字符 日本語 ÀÉÎõü ß",
]
PROMPTS = {
    "text": "<|im_start|>user\nWhat is the order status?<|im_end|>\n<|im_start|>assistant\n",
    "one_image": "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Describe this image.<|im_end|>\n",
    "two_images": "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Compare the first page"
    " with the second page: <|vision_start|><|image_pad|><|vision_end|> Which one has the order?<|im_end|>\n",
}
PROMPT_IMAGES = {"text": [], "one_image": ["img0"], "two_images": ["img0", "img1"]}


def make_tokenizer() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 4, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")


def make_images() -> dict:
    """Seeded synthetic 'screenshots': gradients, blocks and noise, three sizes (one larger than
    the pixel budget, so the processor downscales it)."""
    rng = np.random.default_rng(SEED)
    out = {}
    for name, (w, h) in {"img0": (120, 90), "img1": (200, 60), "img2": (400, 300)}.items():
        yy, xx = np.mgrid[0:h, 0:w]
        img = np.stack([xx * 255 // max(w - 1, 1), yy * 255 // max(h - 1, 1), (xx + yy) % 256], -1)
        for _ in range(6):
            x0, y0 = rng.integers(0, w - 8), rng.integers(0, h - 8)
            img[y0 : y0 + rng.integers(4, h // 2), x0 : x0 + rng.integers(4, w // 2)] = rng.integers(0, 256, 3)
        img = np.clip(img + rng.integers(-12, 13, img.shape), 0, 255).astype(np.uint8)
        out[name] = Image.fromarray(img, "RGB")
    return out


def main() -> None:
    torch.manual_seed(SEED)
    tokenizer = make_tokenizer()
    ids = {s: tokenizer.convert_tokens_to_ids(s) for s in SPECIALS}
    vocab = len(tokenizer)
    cfg = Qwen2_5_VLConfig(
        text_config=dict(
            vocab_size=vocab,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            rms_norm_eps=1e-6,
            rope_theta=1_000_000.0,
            max_position_embeddings=4096,
            tie_word_embeddings=False,
            rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]},
        ),
        vision_config=dict(
            depth=2,
            hidden_size=64,
            intermediate_size=128,
            num_heads=4,
            patch_size=14,
            spatial_merge_size=2,
            temporal_patch_size=2,
            window_size=56,
            out_hidden_size=64,
            fullatt_block_indexes=[1],
            tokens_per_second=2,
        ),
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False,
        attn_implementation="eager",
    )
    model = Qwen2_5_VLForConditionalGeneration(cfg).eval()
    # Random init draws small weights; scale them up so that the tiny model's logits are far from
    # uniform and parity tests measure something.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 1.0 / np.sqrt(p.shape[-1]) if "embed" not in name else 1.0)
            elif "norm" in name or "ln_q" in name:
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0.0, 0.1)

    shutil.rmtree(MODEL_DIR, ignore_errors=True)
    shutil.rmtree(GOLDEN_DIR, ignore_errors=True)
    MODEL_DIR.mkdir(parents=True)
    GOLDEN_DIR.mkdir(parents=True)
    model.save_pretrained(MODEL_DIR, safe_serialization=True, max_shard_size="800KB")
    tokenizer.save_pretrained(MODEL_DIR)
    processor = Qwen2VLImageProcessor(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 16)
    processor.save_pretrained(MODEL_DIR)

    images = make_images()
    tensors: dict = {}
    meta: dict = {"seed": SEED, "torch": torch.__version__, "images": {}, "prompts": {}}
    with torch.no_grad():
        for name, img in images.items():
            img.save(GOLDEN_DIR / f"{name}.png")
            reloaded = Image.open(GOLDEN_DIR / f"{name}.png").convert("RGB")
            p = processor(images=[reloaded], return_tensors="pt")
            pv, grid = p["pixel_values"].float(), p["image_grid_thw"]
            tensors[f"{name}.pixel_values"] = pv
            tensors[f"{name}.grid_thw"] = grid.to(torch.int64)
            visual = model.model.visual
            seen = {}
            def probe(module, args, out):
                seen["in"] = args[0]  # returns None: a hook's return value would replace the output

            hook = visual.merger.register_forward_hook(probe)
            embeds = visual(pv, grid_thw=grid)
            hook.remove()
            # The blocks' output reaches the merger in window order; store it in patch order.
            win, _ = visual.get_window_index(grid)
            unit = visual.spatial_merge_unit
            blocks = seen["in"].reshape(-1, unit, seen["in"].shape[-1])[torch.argsort(win)].reshape(-1, seen["in"].shape[-1])
            tensors[f"{name}.vision_blocks_out"] = blocks.contiguous()
            tensors[f"{name}.image_embeds"] = embeds.contiguous()
            meta["images"][name] = {"size": list(img.size), "grid_thw": grid[0].tolist()}

        for pname, text in PROMPTS.items():
            names = PROMPT_IMAGES[pname]
            grids = [tensors[f"{n}.grid_thw"][0] for n in names]
            # Expand each <|image_pad|> to its merged token count, as the processor does.
            parts = text.split("<|image_pad|>")
            expanded = parts[0]
            for g, rest in zip(grids, parts[1:]):
                expanded += "<|image_pad|>" * int(g.prod() // 4) + rest
            input_ids = torch.tensor([tokenizer(expanded)["input_ids"]])
            kwargs = {}
            if names:
                kwargs["pixel_values"] = torch.cat([tensors[f"{n}.pixel_values"] for n in names])
                kwargs["image_grid_thw"] = torch.stack(grids)
            out = model(input_ids=input_ids, **kwargs)
            pos, _ = model.model.get_rope_index(input_ids, kwargs.get("image_grid_thw"), None, None, None)
            tensors[f"{pname}.input_ids"] = input_ids[0].to(torch.int64)
            tensors[f"{pname}.position_ids"] = pos[:, 0, :].to(torch.int64).contiguous()
            tensors[f"{pname}.logits"] = out.logits[0].float().contiguous()
            meta["prompts"][pname] = {"text": text, "expanded": expanded, "images": names}

    # Tokenizer goldens: strings (specials included) and the ids HF's tokenizer gives.
    strings = CORPUS[:3] + ["Hello  world!\n\n\tTabs", "x=1234567;y=3.14e-10", " leading", "😀 unseen ✓"] + list(PROMPTS.values())
    meta["tokenizer"] = [{"text": s, "ids": tokenizer(s)["input_ids"]} for s in strings]
    meta["special_ids"] = ids
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(GOLDEN_DIR / "golden.safetensors"))
    (GOLDEN_DIR / "golden.json").write_text(json.dumps(meta, indent=1, ensure_ascii=False) + "\n")
    total = sum(f.stat().st_size for f in MODEL_DIR.iterdir()) + sum(f.stat().st_size for f in GOLDEN_DIR.iterdir())
    print(f"wrote {MODEL_DIR} and {GOLDEN_DIR} ({total / 1e6:.2f} MB), vocab {vocab}")


if __name__ == "__main__":
    main()
