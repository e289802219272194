#!/usr/bin/env bash
# HF transformers + torch (CPU) in a venv, installed once and cached:
# ${KAMERA_VL_VENV:-~/.cache/kamera/venv-vl}. `kamera bench vision --against transformers` runs
# Qwen2.5-VL in it (scripts/bench_vision_torch.py); scripts/qwen25vl_golden.py made the tiny
# checkpoint's goldens with the same pins. Idempotent: a venv whose packages import at the pinned
# versions is reused. Prints the venv's python on stdout.
set -euo pipefail
TORCH=${KAMERA_TORCH_VERSION:-2.9.1}
TRANSFORMERS=${KAMERA_TRANSFORMERS_VERSION:-4.57.6}
VENV=${KAMERA_VL_VENV:-$HOME/.cache/kamera/venv-vl}
check() {
  "$VENV/bin/python" -c "import importlib.metadata as m, sys; import torch, transformers, PIL, numpy, safetensors; sys.exit(not (m.version('torch').startswith('$TORCH') and m.version('transformers') == '$TRANSFORMERS'))" 2>/dev/null
}
if [ -x "$VENV/bin/python" ] && check; then
  echo "$VENV/bin/python"; exit 0
fi
echo "vl-venv: installing torch==$TORCH transformers==$TRANSFORMERS into $VENV (a few minutes)" >&2
python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip >&2
"$VENV/bin/pip" install -q "torch==$TORCH" "transformers==$TRANSFORMERS" safetensors pillow numpy accelerate >&2
check || { echo "vl-venv: torch==$TORCH / transformers==$TRANSFORMERS did not install into $VENV" >&2; exit 1; }
echo "$VENV/bin/python"
