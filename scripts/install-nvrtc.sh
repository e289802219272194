#!/usr/bin/env bash
# Fetches NVRTC (the `nvidia-cuda-nvrtc` pip package, pinned and sha256-checked) into the cache
# and prints the folder holding libnvrtc, so the tests can compile every CUDA kernel without a
# GPU. Idempotent. Prints nothing (and exits 0) on machines other than x86-64 Linux.
set -euo pipefail
[ "$(uname -s)-$(uname -m)" = "Linux-x86_64" ] || exit 0
version=13.5.37
sha=86b4d68058807988b7d9af5b44917a0601e9c337f35ccd657bfb3c759ff8d8bc
cache="${KAMERA_HOME:-$HOME/.cache/kamera}"
dest="$cache/nvrtc-$version"
if [ ! -e "$dest/nvidia/cu13/lib/libnvrtc.so.13" ]; then
  dl="$cache/downloads"
  mkdir -p "$dl"
  wheel="$dl/nvidia_cuda_nvrtc-$version-py3-none-manylinux2010_x86_64.manylinux_2_12_x86_64.whl"
  if [ ! -f "$wheel" ]; then
    python3 -m pip download --quiet --no-deps --only-binary=:all: --platform manylinux_2_12_x86_64 \
      --python-version 3 --dest "$dl" "nvidia-cuda-nvrtc==$version" >&2
  fi
  echo "$sha  $wheel" | sha256sum --check --quiet - >&2 || {
    echo "install-nvrtc.sh: $wheel does not have the pinned sha256; removing it" >&2
    rm -f "$wheel"
    exit 1
  }
  rm -rf "$dest.tmp"
  python3 -m zipfile -e "$wheel" "$dest.tmp" >&2
  mv "$dest.tmp" "$dest"
fi
echo "$dest/nvidia/cu13/lib"
