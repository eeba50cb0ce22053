#!/usr/bin/env python3
"""Prints a compact table (name, median us, GB/s, % of measured bandwidth) from a Google
Benchmark JSON file written by encore_bench --benchmark_out=FILE."""
import json
import sys

data = json.load(open(sys.argv[1]))
ctx = data.get("context", {})
print(f"# {ctx.get('device', '?')}  read {float(ctx.get('measured_read_GBps', 0)):.0f} GB/s  "
      f"copy {float(ctx.get('measured_copy_GBps', 0)):.0f} GB/s  {ctx.get('date', '')}")
for b in data["benchmarks"]:
    if b.get("run_type") == "aggregate":
        continue
    pct = b.get("%read_bw", b.get("%copy_bw", 0))
    extra = "".join(f"  {k}={b[k]:.3g}" for k in b if k.startswith("x_"))
    if "us_sum" in b:  # a per-stage breakdown (decode/.../stages): us per role, largest first
        roles = sorted(((k[3:], v) for k, v in b.items() if k.startswith("us.")), key=lambda kv: -kv[1])
        extra = "  " + ", ".join(f"{k} {v:.0f}" for k, v in roles)
        print(f"{b['name']:<64} {b['us_sum']:9.2f} us (sum of stages){extra}")
        continue
    print(f"{b['name']:<64} {b.get('us_median', 0):9.2f} us {b.get('GB/s', 0):8.0f} GB/s {pct:6.1f}%{extra}")
