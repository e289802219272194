#!/usr/bin/env python3
"""Several `kamera bench session` runs (one per site seed) as one table: per method, each seed's
p50 TTFT and mean work as ratios to Kamera's in the same run, its mean KL and same-choice rate,
then the median and the range over the seeds.

Usage: scripts/bench-session-seeds.py RUN_DIR... (each holding a session.json)
"""
import json
import statistics
import sys
from pathlib import Path


def main() -> int:
    runs = []
    for d in sys.argv[1:]:
        j = json.loads((Path(d) / "session.json").read_text())
        s = j["summary"]
        seed = s.get("params", {}).get("seed", "?")
        methods = {m["name"]: m for m in s["methods"]}
        runs.append((d, seed, methods))
    if not runs:
        print(__doc__, file=sys.stderr)
        return 2
    names = [n for n in runs[0][2] if all(n in r[2] for r in runs)]
    print("| method | seeds | TTFT p50 / kamera, median [min, max] | work / kamera, median [min, max] | mean KL, median [min, max] | same choice, min |")
    print("|---|---|---:|---:|---:|---:|")

    def cell(xs, fmt):
        return f"{fmt(statistics.median(xs))} [{fmt(min(xs))}, {fmt(max(xs))}]"

    for n in names:
        ttft = [r[2][n]["ttft_p50_ms"] / r[2]["kamera"]["ttft_p50_ms"] for r in runs]
        work = [r[2][n]["work_mean_ms"] / r[2]["kamera"]["work_mean_ms"] for r in runs]
        kl = [r[2][n]["mean_kl"] for r in runs]
        agree = [r[2][n]["action_agreement"] for r in runs]
        seeds = ", ".join(str(r[1]) for r in runs)
        print(
            f"| {n} | {seeds} | {cell(ttft, lambda x: f'{x:.2f}x')} | {cell(work, lambda x: f'{x:.2f}x')} "
            f"| {cell(kl, lambda x: f'{x:.1e}')} | {min(agree) * 100:.0f}% |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
