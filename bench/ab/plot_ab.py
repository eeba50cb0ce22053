#!/usr/bin/env python3
"""Latency against context from encore_ab's JSON: the graph path, the megakernel and the bandwidth
floor, one panel per batch. Usage: plot_ab.py AB.json OUT.png"""
import json
import sys

try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    sys.exit("plot_ab.py: matplotlib is not installed (pip install matplotlib)")

data = json.load(open(sys.argv[1]))
batches = sorted({r["batch"] for r in data["rows"]})
fig, axes = plt.subplots(1, len(batches), figsize=(5 * len(batches), 4), squeeze=False)
for ax, batch in zip(axes[0], batches):
    rows = sorted((r for r in data["rows"] if r["batch"] == batch), key=lambda r: r["context"])
    ctx = [r["context"] for r in rows]
    for key, label, style in (("graph_us", "CUDA graph", "o-"), ("megakernel_us", "megakernel", "s-"),
                              ("floor_us", "bandwidth floor", "k--")):
        ax.plot(ctx, [r[key] for r in rows], style, label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("context (tokens)")
    ax.set_ylabel("us per decode step")
    ax.set_title(f"batch {batch}")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="center right")
fig.suptitle(f"Kimi-Linear-48B-A3B decode step on {data['device']} (read {data['read_GBps']:.0f} GB/s)")
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=120)
print(f"wrote {sys.argv[2]}")
