#!/usr/bin/env python3
"""Tiny seeded random-weight DeepSeek-V2 checkpoints and their goldens, from HF transformers' own
DeepseekV2ForCausalLM (torch, CPU, f32). DeepSeek-V2 paper: arXiv:2405.04434 (MLA, DeepSeekMoE).

No small pretrained MLA model is at hand, so kamera-model's DeepSeek-V2 runner is checked for exact
parity on small random models of the real architecture: 3 layers (the first dense, then MoE with
4 routed experts, top-2, 1 shared expert, softmax scoring, routed_scaling_factor), MLA with
kv_lora_rank 32, qk_nope 16, qk_rope 8, v 16, 4 heads, byte-sized vocab (256; ids fed directly, no
tokenizer). Two variants:

  deepseekv2-tiny/         q_lora_rank 24 (q_a_proj, q_a_layernorm, q_b_proj), YaRN rope scaling
                           (factor 4, original_max_position_embeddings 16, mscale 1, mscale_all_dim
                           0.707: the cos/sin attention factor and the softmax mscale both differ
                           from 1, unlike DeepSeek-V2's released mscale = mscale_all_dim), greedy top-k
  deepseekv2-tiny-noq/     q_lora_rank null (q_proj), plain rope, group_limited_greedy routing
                           (2 groups, top 1 group)

Each directory holds the checkpoint as HF writes it (config.json, model.safetensors, bf16 weights
so the files stay small; the goldens are computed from those bf16 values in f32), a byte tokenizer
(tokenizer.json: id = byte value, no merges) and golden.safetensors:
  input_ids [n] (int64), logits [n, vocab] at every position,
  layer{l}.latent [n, kv_lora_rank]: c_KV after kv_a_layernorm, what HF's cache holds as keys,
  layer{l}.k_rope [n, qk_rope_head_dim]: k_pe after rotation (HF rotates interleaved pairs
      (2i, 2i+1) as complex numbers and scales cos/sin by YaRN's attention factor), HF's cache values.

Setup (once; pinned): python3 -m venv ~/.cache/kamera/venv-torch &&
  ~/.cache/kamera/venv-torch/bin/pip install torch==2.15.0 transformers==5.25.0 safetensors==0.8.0 numpy==2.4.6
Usage: ~/.cache/kamera/venv-torch/bin/python scripts/deepseek_v2_golden.py
"""
import json
import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import DeepseekV2Config, DeepseekV2ForCausalLM

ROOT = Path(__file__).resolve().parent.parent / "crates/kamera-model/tests/golden"
SEED = 20261203
N_TOKENS = 24

COMMON = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=96,
    moe_intermediate_size=32,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=4,
    first_k_dense_replace=1,
    n_routed_experts=4,
    num_experts_per_tok=2,
    n_shared_experts=1,
    routed_scaling_factor=1.5,
    kv_lora_rank=32,
    qk_nope_head_dim=16,
    qk_rope_head_dim=8,
    v_head_dim=16,
    rms_norm_eps=1e-6,
    max_position_embeddings=64,
    tie_word_embeddings=False,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
    attn_implementation="eager",
)
VARIANTS = {
    "deepseekv2-tiny": dict(
        q_lora_rank=24,
        topk_method="greedy",
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 4.0,
            "original_max_position_embeddings": 16,
            "beta_fast": 32,
            "beta_slow": 1,
            "mscale": 1.0,
            "mscale_all_dim": 0.707,
        },
    ),
    "deepseekv2-tiny-noq": dict(
        q_lora_rank=None,
        topk_method="group_limited_greedy",
        n_group=2,
        topk_group=1,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    ),
}


def bytes_to_unicode() -> dict:
    """GPT-2's byte -> printable character map (what byte-level BPE vocabularies are written in)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def write_tokenizer(out_dir: Path) -> None:
    """A byte tokenizer (token id = byte value, no merges) in tokenizer.json's byte-level BPE
    form, so the tiny checkpoints read text like any model directory."""
    vocab = {ch: b for b, ch in bytes_to_unicode().items()}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.save(str(out_dir / "tokenizer.json"))
    assert tok.encode("Hi ü").ids == list("Hi ü".encode())


def randomize(model: torch.nn.Module) -> None:
    """Random init draws small weights; scale them so the logits are far from uniform, norms
    away from 1 (so a missing norm weight shows), the LM head x4 (logits far from uniform, argmax
    margins well above the parity error), and round everything to bf16 values."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
            elif p.dim() >= 2:
                std = {"embed_tokens": 1.0, "lm_head": 4.0}.get(name.split(".")[-2], 1.0)
                p.normal_(0.0, std / (1.0 if "embed" in name else np.sqrt(p.shape[-1])))
            else:
                p.normal_(0.0, 0.1)
            p.copy_(p.to(torch.bfloat16).float())


def build(name: str, extra: dict, ids: torch.Tensor) -> dict:
    cfg = DeepseekV2Config(**COMMON, **extra)
    model = DeepseekV2ForCausalLM(cfg).eval()
    randomize(model)
    out_dir = ROOT / name
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True)
    model.to(torch.bfloat16).save_pretrained(out_dir, safe_serialization=True)
    write_tokenizer(out_dir)
    # The goldens come from the checkpoint as saved, reloaded in f32 (what a user's loader sees).
    model = DeepseekV2ForCausalLM.from_pretrained(out_dir, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        out = model(input_ids=ids[None], use_cache=True)
    cache = out.past_key_values if hasattr(out, "past_key_values") else out.cache
    tensors = {"input_ids": ids.to(torch.int64), "logits": out.logits[0].float()}
    for l, layer in enumerate(cache.layers):
        tensors[f"layer{l}.latent"] = layer.keys[0, 0].float()
        tensors[f"layer{l}.k_rope"] = layer.values[0, 0].float()
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out_dir / "golden.safetensors"))
    top2 = out.logits[0].topk(2, dim=-1).values
    margin = float((top2[:, 0] - top2[:, 1]).min())
    size = sum(f.stat().st_size for f in out_dir.iterdir())
    print(f"{name}: {size / 1e3:.0f} kB, logit std {float(out.logits.std()):.2f}, min top-2 margin {margin:.4f}")
    return {"variant": name, "min_top2_margin": margin, "bytes": size}


def main() -> None:
    torch.manual_seed(SEED)
    ids = torch.randint(0, COMMON["vocab_size"], (N_TOKENS,), generator=torch.Generator().manual_seed(SEED))
    meta = {"seed": SEED, "torch": torch.__version__, "variants": []}
    for name, extra in VARIANTS.items():
        meta["variants"].append(build(name, extra, ids))
    print(json.dumps(meta))


if __name__ == "__main__":
    main()
