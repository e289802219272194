#!/usr/bin/env bash
# Side-by-side throughput, one run: `kamera bench model` and HF transformers + torch (CPU, f32)
# on the same cached GGUF, per model. Prints a markdown table; JSON lines go to $OUT (default
# target/bench-model.jsonl). Needs: cargo, and python with torch transformers accelerate gguf.
# Usage: scripts/bench_model.sh [model ...]   (PYTHON=... to pick the interpreter)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
OUT=${OUT:-target/bench-model.jsonl}
MODELS=("$@")
[ ${#MODELS[@]} -eq 0 ] && MODELS=(smollm2-135m qwen2.5-0.5b gemma3-270m)
cargo build --release -q -p kamera-cli
: > "$OUT"
for m in "${MODELS[@]}"; do
  ./target/release/kamera models fetch "$m" > /dev/null
  ./target/release/kamera bench model --model "$m" --json >> "$OUT"
  "$PYTHON" scripts/bench_torch.py --model "$m" 2>/dev/null >> "$OUT"
done
"$PYTHON" - "$OUT" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
keys = ["prefill_512_tok_s", "prefill_2048_tok_s", "decode_tok_s"]
print("| model | engine | prefill 512 tok/s | prefill 2048 tok/s | decode tok/s |")
print("|---|---|---:|---:|---:|")
for r in rows:
    print(f"| {r['model']} | {r['engine']} | " + " | ".join(f"{r['results'].get(k, float('nan')):.1f}" for k in keys) + " |")
PY
