#!/usr/bin/env bash
# Builds llama.cpp (through its Python package, llama-cpp-python, from source with this CPU's
# native flags) into a venv once, cached: ${KAMERA_LLAMACPP_VENV:-~/.cache/kamera/venv-llamacpp}.
# Idempotent: a venv whose package imports is reused. Prints the venv's python on stdout.
set -euo pipefail
VERSION=${LLAMACPP_VERSION:-0.3.36}
VENV=${KAMERA_LLAMACPP_VENV:-$HOME/.cache/kamera/venv-llamacpp}
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import llama_cpp, sys; sys.exit(llama_cpp.__version__ != '$VERSION')" 2>/dev/null; then
  echo "$VENV/bin/python"; exit 0
fi
python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip >&2
echo "llamacpp-venv: building llama-cpp-python==$VERSION from source (about 10 minutes on 2 cores)" >&2
CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAMA_CURL=OFF" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
  "$VENV/bin/pip" install -q --no-binary llama-cpp-python "llama-cpp-python==$VERSION" >&2
"$VENV/bin/python" -c "import llama_cpp; print('llamacpp-venv: llama-cpp-python', llama_cpp.__version__)" >&2
echo "$VENV/bin/python"
