#!/usr/bin/env bash
# Builds llama.cpp (through its Python package, llama-cpp-python, from source with this CPU's
# native flags) into a venv once, cached: ${KAMERA_LLAMACPP_VENV:-~/.cache/kamera/venv-llamacpp}.
# Idempotent: a venv whose package imports is reused. Prints the venv's python on stdout.
# Needs a C/C++ compiler (apt-get install -y build-essential); cmake comes from pip.
set -euo pipefail
VERSION=${LLAMACPP_VERSION:-0.3.36}
VENV=${KAMERA_LLAMACPP_VENV:-$HOME/.cache/kamera/venv-llamacpp-v2}
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import llama_cpp, sys; sys.exit(llama_cpp.__version__ != '$VERSION')" 2>/dev/null; then
  echo "$VENV/bin/python"; exit 0
fi
python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip >&2
echo "llamacpp-venv: building llama-cpp-python==$VERSION from source (about 10 minutes on 2 cores)" >&2
# This CPU's vector extensions, named one by one instead of GGML_NATIVE: native would also turn
# on ggml's AMX path, whose matrix product segfaults on the VMs this project runs on.
flags=$(grep -m1 '^flags' /proc/cpuinfo || true)
has() { [[ " $flags " == *" $1 "* ]] && echo ON || echo OFF; }
CPU_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=$(has avx) -DGGML_AVX2=$(has avx2) -DGGML_FMA=$(has fma) -DGGML_F16C=$(has f16c) -DGGML_BMI2=$(has bmi2)"
CPU_ARGS+=" -DGGML_AVX_VNNI=$(has avx_vnni) -DGGML_AVX512=$(has avx512f) -DGGML_AVX512_VBMI=$(has avx512vbmi)"
CPU_ARGS+=" -DGGML_AVX512_VNNI=$(has avx512_vnni) -DGGML_AVX512_BF16=$(has avx512_bf16) -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
CMAKE_ARGS="$CPU_ARGS -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
  "$VENV/bin/pip" install -q --no-cache-dir --no-binary llama-cpp-python "llama-cpp-python==$VERSION" >&2
"$VENV/bin/python" -c "import llama_cpp; print('llamacpp-venv: llama-cpp-python', llama_cpp.__version__)" >&2
echo "$VENV/bin/python"
