#!/usr/bin/env bash
# GPU checks for kamera-gpu, as one prepared script for a lent device (which has no Rust
# toolchain and no registry).
#   here:   scripts/gpu-check.sh --build    builds the parity tests (kernels and device model) and
#                                           both benches (kamera-gpu/benches) with `--features cuda` into .gpu/
#                                           (git-ignored; carry it)
#   device: scripts/gpu-check.sh            runs the device-model parity tests, the kernel parity
#                                           tests (both #[ignore]d on a plain `cargo test`, so a
#                                           CPU run never counts them: run here with
#                                           --include-ignored, where a missing device fails them),
#                                           the model bench (Qwen2.5-0.5B shape: prefill
#                                           tokens/s, relocate + patch ms, revisit TTFT vs full
#                                           re-prefill), the bandwidth bench (T = 1024..16384, 28
#                                           layers, F = 512, rank 0/16/32) and compute-sanitizer
#                                           memcheck: about 3 minutes on an H200.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = "--build" ]; then
  mkdir -p .gpu
  grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
  # Copies the executable of the test or bench target $2 (kind $1) as .gpu/$3.
  pick() {
    local kind=$1 name=$2 as=$3 cmd
    if [ "$kind" = test ]; then cmd=test; else cmd=bench; fi
    bin=$(cargo "$cmd" --release -p kamera-gpu --features cuda --"$kind" "$name" --no-run --message-format=json 2>/dev/null \
      | K="$kind" T="$name" python3 -c 'import json,os,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == os.environ["T"] and os.environ["K"] in m["target"]["kind"]:
        print(m["executable"])' | tail -n 1)
    [ -n "$bin" ] || { echo "gpu-check: no executable for $kind $name" >&2; exit 1; }
    cp "$bin" ".gpu/$as"
  }
  pick test parity parity
  pick test model model
  pick bench bandwidth bench-bandwidth
  pick bench model bench-model
  ls -la .gpu
  echo "built; on the device run: scripts/gpu-check.sh   (carry .gpu)"
  exit 0
fi

[ -x .gpu/model ] || { echo "gpu-check: .gpu/model missing: run 'scripts/gpu-check.sh --build' here and carry .gpu" >&2; exit 1; }
# NVRTC and the driver: the toolkit's lib64 and any pip-installed nvidia-cuda-nvrtc.
extra=$(python3 - <<'PY' 2>/dev/null || true
import glob, site
dirs = set()
for s in site.getsitepackages():
    for p in glob.glob(s + "/nvidia/**/libnvrtc*.so*", recursive=True) + glob.glob(s + "/nvidia/**/libcublas*.so*", recursive=True):
        dirs.add(p.rsplit("/", 1)[0])
print(":".join(sorted(dirs)))
PY
)
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:/usr/local/nvidia/lib64:${extra}:${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
echo "== device model parity (DeviceModel vs the CPU reference forward and kamera-ops reuse)"
timeout 120 .gpu/model --include-ignored --nocapture --test-threads 1
echo "== parity (GPU vs kamera-ops CPU reference)"
timeout 150 .gpu/parity --include-ignored --nocapture --test-threads 1
echo "== model bench (revisit TTFT: resident chunks placed + question vs full re-prefill)"
timeout 200 .gpu/bench-model qwen2.5-0.5b --ranks 0,32 --json "${OUT:-/tmp}/model-bench.json"
echo "== bandwidth (fused relocate + patch vs device copy)"
timeout 150 .gpu/bench-bandwidth
if command -v compute-sanitizer >/dev/null; then
  echo "== memcheck (compute-sanitizer over the parity tests; some sandboxes refuse the device)"
  timeout 120 compute-sanitizer --tool memcheck --error-exitcode 3 .gpu/parity --include-ignored --test-threads 1 2>&1 | tail -n 15 || echo "memcheck: exit $?"
  timeout 120 compute-sanitizer --tool memcheck --error-exitcode 3 .gpu/model --include-ignored --test-threads 1 2>&1 | tail -n 15 || echo "memcheck (model): exit $?"
fi
