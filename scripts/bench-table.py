#!/usr/bin/env python3
"""Prints a markdown table of criterion results (mean time, throughput) for one group."""
import json, pathlib, sys

root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "target/criterion")
rows = []
for est in sorted(root.glob("**/new/estimates.json")):
    bench = json.loads((est.parent / "benchmark.json").read_text())
    mean_ns = json.loads(est.read_text())["mean"]["point_estimate"]
    tp = (bench.get("throughput") or {}).get("Bytes")
    gbs = f"{tp / mean_ns:.2f}" if tp else "-"
    rows.append((bench["full_id"], f"{mean_ns / 1e6:.2f}", gbs))
print("| benchmark | mean ms | GB/s (read+write) |")
print("|---|---:|---:|")
for r in rows:
    print("| " + " | ".join(r) + " |")
