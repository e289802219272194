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

  qwen25vl-preprocess/   preprocessing goldens from PIL alone (`--preprocess-only` writes just these): small
                         PNGs in every PNG colour type and bit depth with PIL's convert("RGB") of each,
                         and PIL bicubic resizes (up, down past the support widening, one axis only)

Setup (once; pinned): python3 -m venv ~/.cache/kamera/venv-vl &&
  ~/.cache/kamera/venv-vl/bin/pip install torch==2.9.1 transformers==4.57.6 safetensors pillow numpy
Usage: ~/.cache/kamera/venv-vl/bin/python scripts/qwen25vl_golden.py [--preprocess-only]
"""
import json
import shutil
import struct
import sys
import zlib
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
PREPROCESS_DIR = ROOT / "qwen25vl-preprocess"
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


def vision_config(depth: int, intermediate_size: int, fullatt_block_indexes: list) -> dict:
    """A tiny vision tower: 64 wide, 4 heads, 14-pixel patches merged 2x2, window 56."""
    return dict(
        depth=depth,
        hidden_size=64,
        intermediate_size=intermediate_size,
        num_heads=4,
        patch_size=14,
        spatial_merge_size=2,
        temporal_patch_size=2,
        window_size=56,
        out_hidden_size=64,
        fullatt_block_indexes=fullatt_block_indexes,
        tokens_per_second=2,
    )


def special_ids(ids: dict) -> dict:
    """The config's image, video and vision start / end token ids, from the tokenizer's."""
    return dict(
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
    )


def save_checkpoint(model, tokenizer, processor, model_dir: Path, golden_dir: Path) -> None:
    """Empties both folders, then saves the checkpoint in the Hugging Face layout (shards of
    800 KB, safetensors) with its tokenizer and image processor."""
    shutil.rmtree(model_dir, ignore_errors=True)
    shutil.rmtree(golden_dir, ignore_errors=True)
    model_dir.mkdir(parents=True)
    golden_dir.mkdir(parents=True)
    model.save_pretrained(model_dir, max_shard_size="800KB")
    tokenizer.save_pretrained(model_dir)
    processor.save_pretrained(model_dir)


def randomize(model) -> None:
    """Random init draws small weights; scale them up so that the tiny model's logits are far
    from uniform and parity tests measure something."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 1.0 / np.sqrt(p.shape[-1]) if "embed" not in name else 1.0)
            elif "norm" in name or "ln_q" in name:
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0.0, 0.1)


def expand(text: str, grids: list) -> str:
    """Each <|image_pad|> expanded to its image's merged token count, as the processor does."""
    parts = text.split("<|image_pad|>")
    expanded = parts[0]
    for g, rest in zip(grids, parts[1:]):
        expanded += "<|image_pad|>" * int(g.prod() // 4) + rest
    return expanded


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
        vision_config=vision_config(depth=2, intermediate_size=128, fullatt_block_indexes=[1]),
        **special_ids(ids),
        tie_word_embeddings=False,
        attn_implementation="eager",
    )
    model = Qwen2_5_VLForConditionalGeneration(cfg).eval()
    randomize(model)
    processor = Qwen2VLImageProcessor(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 16)
    save_checkpoint(model, tokenizer, processor, MODEL_DIR, GOLDEN_DIR)

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
            expanded = expand(text, grids)
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


ADAM7 = [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2)]


def encode_png(
    path: Path, width: int, height: int, color_type: int, depth: int, samples: np.ndarray, extra: list, interlace=False
) -> None:
    """A plain PNG encoder (no filtering; Adam7 optional) for colour types and depths PIL cannot write.
    `samples` is [h, w * channels]; `extra` the (chunk type, data) pairs before IDAT (PLTE, tRNS)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    ch = samples.shape[1] // width
    if interlace:
        passes = []
        for x0, y0, dx, dy in ADAM7:
            sub = samples.reshape(height, width, ch)[y0::dy, x0::dx]
            if sub.size:
                passes += pack_samples(sub.reshape(sub.shape[0], -1), depth)
        rows = passes
    else:
        rows = pack_samples(samples, depth)
    raw = b"".join(b"\x00" + bytes(r) for r in rows)
    ihdr = struct.pack(">IIBBBBB", width, height, depth, color_type, 0, 0, int(interlace))
    out = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr)
    for kind, data in extra:
        out += chunk(kind, data)
    out += chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")
    path.write_bytes(out)


def pack_samples(samples: np.ndarray, depth: int) -> list:
    """Pack an [h, w * channels] array of samples into PNG scanlines of the given bit depth."""
    rows = []
    for r in samples:
        if depth == 16:
            rows.append(b"".join(struct.pack(">H", int(v)) for v in r))
        elif depth == 8:
            rows.append(bytes(int(v) for v in r))
        else:
            bits = "".join(format(int(v), f"0{depth}b") for v in r)
            bits += "0" * (-len(bits) % 8)
            rows.append(bytes(int(bits[i : i + 8], 2) for i in range(0, len(bits), 8)))
    return rows


def preprocess_goldens() -> None:
    """PNG decoding and PIL bicubic resize goldens for kamera-model's image preprocessing."""
    rng = np.random.default_rng(SEED + 1)
    shutil.rmtree(PREPROCESS_DIR, ignore_errors=True)
    PREPROCESS_DIR.mkdir(parents=True)
    tensors: dict = {}
    w, h = 7, 5
    # (name, colour type, bit depth, channels, with tRNS)
    kinds = [
        ("gray1", 0, 1, 1, False),
        ("gray2", 0, 2, 1, False),
        ("gray4", 0, 4, 1, False),
        ("gray8", 0, 8, 1, False),
        ("gray8_trns", 0, 8, 1, True),
        ("gray16", 0, 16, 1, False),
        ("gray16_trns", 0, 16, 1, True),
        ("rgb8", 2, 8, 3, False),
        ("rgb8_trns", 2, 8, 3, True),
        ("rgb16", 2, 16, 3, False),
        ("pal1", 3, 1, 1, False),
        ("pal4", 3, 4, 1, False),
        ("pal8", 3, 8, 1, False),
        ("pal8_trns", 3, 8, 1, True),
        ("graya8", 4, 8, 2, False),
        ("graya16", 4, 16, 2, False),
        ("rgba8", 6, 8, 4, False),
        ("rgba16", 6, 16, 4, False),
    ]
    for name, ct, depth, ch, trns in kinds:
        top = (1 << depth) - 1
        if ct == 3:
            entries = 1 << depth
            samples = rng.integers(0, entries, (h, w * ch))
            palette = rng.integers(0, 256, (entries, 3))
            extra = [(b"PLTE", bytes(int(v) for v in palette.flatten()))]
            if trns:
                extra.append((b"tRNS", bytes(int(v) for v in rng.integers(0, 256, entries))))
        else:
            samples = rng.integers(0, top + 1, (h, w * ch))
            if depth == 16 and ct == 0:
                # Low values too: PIL reads 16-bit grey as I;16 and converts it by clipping.
                samples[0] = rng.integers(0, 300, w)
            extra = []
            if trns:
                extra.append((b"tRNS", b"".join(struct.pack(">H", int(v)) for v in samples[0, :ch])))
        path = PREPROCESS_DIR / f"{name}.png"
        encode_png(path, w, h, ct, depth, samples, extra)
        with Image.open(path) as im:
            tensors[f"decode.{name}"] = torch.from_numpy(np.asarray(im.convert("RGB")).copy())

    # Resizes: the golden images to their processor sizes, and synthetic cases.
    processor = Qwen2VLImageProcessor(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 16)
    cases = {}
    for name in ("img0", "img1", "img2"):
        with Image.open(GOLDEN_DIR / f"{name}.png") as im:
            src = im.convert("RGB")
        from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize

        rh, rw = smart_resize(src.height, src.width, 28, processor.min_pixels, processor.max_pixels)
        cases[name] = (src, rw, rh)
    # Adam7: a size where every pass is non-empty and one where some are empty.
    for name, (iw, ih) in {"rgb8_adam7": (11, 9), "rgba16_adam7": (3, 2)}.items():
        ct, depth, ch = (2, 8, 3) if name.startswith("rgb8") else (6, 16, 4)
        samples = rng.integers(0, (1 << depth), (ih, iw * ch))
        path = PREPROCESS_DIR / f"{name}.png"
        encode_png(path, iw, ih, ct, depth, samples, [], interlace=True)
        with Image.open(path) as im:
            tensors[f"decode.{name}"] = torch.from_numpy(np.asarray(im.convert("RGB")).copy())

    for name, (sw, sh, ow, oh) in {
        "up": (9, 6, 23, 17),
        "down7": (70, 35, 10, 5),
        "down_odd": (101, 53, 29, 11),
        "x_only": (31, 12, 50, 12),
        "y_only": (12, 31, 12, 9),
        "to_one": (13, 9, 1, 1),
        "from_one": (1, 1, 5, 4),
        "line": (40, 1, 17, 3),
    }.items():
        src = Image.fromarray(rng.integers(0, 256, (sh, sw, 3)).astype(np.uint8), "RGB")
        cases[name] = (src, ow, oh)
    for name, (src, ow, oh) in cases.items():
        if name.startswith("img"):
            tensors[f"resize.{name}.out"] = torch.from_numpy(np.asarray(src.resize((ow, oh), Image.BICUBIC)).copy())
        else:
            tensors[f"resize.{name}.src"] = torch.from_numpy(np.asarray(src).copy())
            tensors[f"resize.{name}.out"] = torch.from_numpy(np.asarray(src.resize((ow, oh), Image.BICUBIC)).copy())
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(PREPROCESS_DIR / "preprocess.safetensors"))

    # smart_resize: (height, width, factor, min_pixels, max_pixels) -> [h, w] or the error HF raises.
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize as hf_smart_resize

    default_min, default_max = 56 * 56, 28 * 28 * 1280
    smart = []
    for h, w, f, lo, hi in [
        (90, 120, 28, 3136, 12544),
        (60, 200, 28, 3136, 12544),
        (300, 400, 28, 3136, 12544),
        (42, 70, 28, default_min, default_max),  # 1.5 and 2.5 factors: Python rounds half to even
        (98, 126, 28, default_min, default_max),  # 3.5 and 4.5
        (126, 70, 28, default_min, default_max),  # 4.5 and 2.5 on the other axes
        (1080, 1920, 28, default_min, default_max),
        (720, 1280, 28, default_min, default_max),
        (720, 1280, 28, default_min, 12845056),
        (2160, 3840, 28, default_min, default_max),
        (1, 1, 28, default_min, default_max),
        (10, 10, 28, default_min, default_max),
        (5, 1000, 28, default_min, default_max),
        (1, 200, 28, default_min, default_max),
        (1, 201, 28, default_min, default_max),
        (4000, 19, 28, default_min, default_max),
        (30000, 200, 28, default_min, default_max),
        (333, 777, 32, 1024, 100000),
        (768, 1366, 28, 3136, 28 * 28 * 256),
    ]:
        try:
            out = list(hf_smart_resize(h, w, f, lo, hi))
        except ValueError as e:
            out = str(e)
        smart.append({"height": h, "width": w, "factor": f, "min_pixels": lo, "max_pixels": hi, "out": out})
    (PREPROCESS_DIR / "smart_resize.json").write_text(json.dumps(smart, indent=1) + "\n")
    total = sum(f.stat().st_size for f in PREPROCESS_DIR.iterdir())
    print(f"wrote {PREPROCESS_DIR} ({total / 1e3:.1f} kB)")


if __name__ == "__main__":
    if "--preprocess-only" not in sys.argv[1:]:
        main()
    preprocess_goldens()
