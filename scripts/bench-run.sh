#!/usr/bin/env bash
# Times `kamera run SCENARIO` three ways in paired alternation, N rounds (default 5): --no-reuse,
# reuse over a fresh store (cold), and reuse again over that store (warm). Prints each run's wall
# time (the `time` line) and tokens prefilled, then the median [min, max] of each and the median
# of the per-round ratios to --no-reuse, with the CPU, load and commit.
#   scripts/bench-run.sh [SCENARIO] [N]      (KAMERA: the binary, default target/release/kamera)
set -euo pipefail
cd "$(dirname "$0")/.."
scenario=${1:-scenarios/order-status.toml}
rounds=${2:-5}
kamera=${KAMERA:-${CARGO_TARGET_DIR:-target}/release/kamera}
[ -x "$kamera" ] || { echo "bench-run: $kamera missing: cargo build --release -p kamera-cli" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "scenario $scenario, $rounds rounds; cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); load: $(cut -d' ' -f1-3 /proc/loadavg); commit: $(git rev-parse --short HEAD)$(git diff --quiet || echo -dirty)"
one() { # label, args...
  local label=$1; shift
  local out; out=$("$kamera" run "$@" "$scenario" 2>&1) || { echo "$out" >&2; echo "bench-run: $label failed" >&2; exit 1; }
  local secs tokens
  secs=$(sed -n 's/^time *\([0-9.]*\) s run.*/\1/p' <<<"$out")
  tokens=$(sed -n 's/^session .* \([0-9]*\) prefilled$/\1/p' <<<"$out")
  grep -q '^result *PASS' <<<"$out" || { echo "$out" >&2; echo "bench-run: $label did not pass" >&2; exit 1; }
  echo "$label $secs $tokens" | tee -a "$tmp/runs"
}
for r in $(seq 1 "$rounds"); do
  one no-reuse --no-reuse --store "$tmp/nr-$r"
  one cold --store "$tmp/s-$r"
  one warm --store "$tmp/s-$r"
done
python3 - "$tmp/runs" <<'PY'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    label, secs, tokens = line.split()
    runs.setdefault(label, []).append((float(secs), int(tokens)))
base = [s for s, _ in runs["no-reuse"]]
for label, xs in runs.items():
    secs = [s for s, _ in xs]
    ratio = [s / b for s, b in zip(secs, base)]
    print(f"{label:9} {statistics.median(secs):5.2f} s [{min(secs):.2f}, {max(secs):.2f}]  "
          f"tokens prefilled {statistics.median([t for _, t in xs]):.0f}  "
          f"/ no-reuse: median {statistics.median(ratio):.2f}x [{min(ratio):.2f}, {max(ratio):.2f}]")
PY
