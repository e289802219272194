#!/usr/bin/env bash
# `kamera run --parallel N` for N = 1, 2, 4, 8 on the same 8 episodes (order-status and
# directory-pages alternating, scripted, on the local site, embedded SmolLM2-135M, no persistent
# store): episodes per minute and peak memory (PSS of the process and its browsers), and the
# memory each extra episode costs over N = 1. Writes bench/parallel/parallel.json and prints a
# Markdown table. Usage: scripts/bench-parallel.sh [KAMERA_BINARY]
set -euo pipefail
cd "$(dirname "$0")/.."
K=${1:-${CARGO_TARGET_DIR:-target}/release/kamera}
[ -x "$K" ] || { echo "bench-parallel: no kamera binary at $K (cargo build --release -p kamera-cli)" >&2; exit 1; }
out=bench/parallel
mkdir -p "$out"
episodes=()
for i in 1 2 3 4; do episodes+=(scenarios/order-status.toml scenarios/directory-pages.toml); done
runs=()
for n in 1 2 4 8; do
  f=$(mktemp)
  "$K" run --parallel "$n" "${episodes[@]}" --no-store --json >"$f" 2>/dev/null || { echo "bench-parallel: N=$n failed" >&2; cat "$f" >&2; exit 1; }
  runs+=("$f")
done
python3 - "$out/parallel.json" "$(git rev-parse --short HEAD)" "${runs[@]}" <<'PY'
import json, os, platform, sys
path, commit, files = sys.argv[1], sys.argv[2], sys.argv[3:]
runs = [json.load(open(f)) for f in files]
cpu = next((l.split(':', 1)[1].strip() for l in open('/proc/cpuinfo') if l.startswith('model name')), platform.processor())
meta = {"commit": commit, "cpu": cpu, "cores": os.cpu_count(), "load_1m": os.getloadavg()[0]}
base = runs[0]
rows = []
for r in runs:
    n = r["concurrency"]
    extra = (r["peak_pss_mb"] - base["peak_pss_mb"]) / (n - 1) if n > 1 else None
    passed = sum(1 for e in r["runs"] if e["success"])
    rows.append({"n": n, "episodes": r["episodes"], "passed": passed, "wall_s": r["wall_ms"] / 1e3,
                 "episodes_per_minute": r["episodes_per_minute"], "speedup": r["episodes_per_minute"] / base["episodes_per_minute"],
                 "peak_pss_mb": r["peak_pss_mb"], "mb_per_extra_episode": extra, "peak_rss_self_mb": r["peak_rss_self_mb"]})
json.dump({"meta": meta, "rows": rows, "runs": runs}, open(path, "w"), indent=1)
print(f"commit {commit}, {cpu}, {meta['cores']} cores, load {meta['load_1m']:.2f} at the end")
print("| N | episodes (passed) | wall s | episodes/min | vs N=1 | peak PSS MB | MB per extra episode | process RSS MB |")
print("|---:|---:|---:|---:|---:|---:|---:|---:|")
for x in rows:
    e = "-" if x["mb_per_extra_episode"] is None else f"{x['mb_per_extra_episode']:.0f}"
    print(f"| {x['n']} | {x['episodes']} ({x['passed']}) | {x['wall_s']:.1f} | {x['episodes_per_minute']:.1f} | {x['speedup']:.2f}x | {x['peak_pss_mb']:.0f} | {e} | {x['peak_rss_self_mb']:.0f} |")
PY
rm -f "${runs[@]}"
