#!/usr/bin/env python3
"""Summary of Nsight Compute raw-page CSVs (bench/profile/profile_check.sh): per profiled kernel,
its time, DRAM and issue utilisation, warps per scheduler, and the top stall reasons (the
WarpStateStats ratios ncu collected). Usage: ncu_summary.py FILE.csv ..."""
import csv
import os
import sys

KEYS = [
    ("gpu__time_duration.sum", "time"),
    ("dram__throughput.avg.pct_of_peak_sustained_elapsed", "dram %"),
    ("sm__throughput.avg.pct_of_peak_sustained_elapsed", "sm %"),
    ("smsp__issue_active.avg.pct_of_peak_sustained_active", "issue %"),
    ("smsp__warps_active.avg.per_cycle_active", "warps/sched"),
    ("smsp__warps_eligible.avg.per_cycle_active", "eligible/sched"),
    ("launch__registers_per_thread", "regs"),
    ("launch__grid_size", "grid"),
]
STALL = "smsp__average_warp_latency_issue_stalled_"
STALL_ALT = "smsp__average_warps_issue_stalled_"


def rows_of(path):
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]  # ncu prints its own notes before the table
    reader = list(csv.reader(lines))
    if len(reader) < 3:
        return []
    header, units = reader[0], reader[1]
    return [(header, units, r) for r in reader[2:]]


def number(v):
    try:
        return float(v.replace(",", ""))
    except ValueError:
        return None


def main(paths):
    for path in paths:
        name = os.path.basename(path)[4:-4]
        rows = rows_of(path)
        if not rows:
            print(f"{name}: no kernel profiled (see {path[:-4]}.log)")
            continue
        for header, units, r in rows:
            col = dict(zip(header, r))
            unit = dict(zip(header, units))
            kernel = col.get("Kernel Name", "?")[:60]
            parts = []
            for key, label in KEYS:
                if key in col:
                    parts.append(f"{label} {col[key]}{(' ' + unit[key]) if unit.get(key) and label == 'time' else ''}")
            stalls = []
            for k, v in col.items():
                if (k.startswith(STALL) or k.startswith(STALL_ALT)) and k.endswith(".ratio"):
                    x = number(v)
                    if x is not None:
                        reason = k.replace(STALL, "").replace(STALL_ALT, "").split("_per_")[0]
                        stalls.append((x, reason))
            stalls.sort(reverse=True)
            print(f"{name}: {kernel}")
            print("    " + ", ".join(parts))
            if stalls:
                print("    top stall reasons (ncu ratios): " + ", ".join(f"{r} {x:.2f}" for x, r in stalls[:6]))


if __name__ == "__main__":
    main(sys.argv[1:])
