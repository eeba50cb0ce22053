#!/usr/bin/env python3
"""Per function of one profiled kernel, from Nsight Compute's source page (SASS, CSV:
`ncu -i REPORT --page source --csv --print-source sass`, as profile_check.sh writes it): the share
of warp samples, warp instructions executed, the code executed at least once (its footprint, the
bytes an SM fetches again when the function runs cold) and the top stall reasons. The megakernel's
bodies are separate functions (run_op<Opcode, tokens>), named here by opcode.
With --hot FUNCTION: that function's straight-line runs (instructions executed equally often),
most executed first, with their share of the samples and of 'no instruction' stalls.
Usage: ncu_source.py SOURCE.csv [--hot NAME] [--top N]"""
import argparse
import collections
import csv
import re

# pipeline/megakernel/program.cuh's Opcode, in order.
OPCODES = ["embed", "gemv", "kda", "mla_sched", "mla_q_absorb", "mla_kv_append", "mla_splitkv", "mla_combine",
           "mla_v_up", "router_gemv", "router_topk", "moe_list", "moe_quantize", "moe_gate_up", "moe_down"]


def short_name(kernel):
    m = re.search(r"run_op<\(encore::pipeline::megakernel::Opcode\)(\d+), \(int\)(\d+)>", kernel)
    if m:
        op = int(m.group(1))
        return (OPCODES[op] if op < len(OPCODES) else f"opcode {op}") + (f"<{m.group(2)}>" if m.group(2) != "1" else "")
    if "megakernel<" in kernel:
        return "megakernel (instruction loop)"
    return re.sub(r"\(.*", "", kernel)[:48]


def functions(path):
    """[(name, header, rows)] in file order; a function may appear more than once."""
    out, header = [], None
    with open(path, newline="") as f:
        for row in csv.reader(f):
            if not row:
                continue
            if row[0] == "Kernel Name":
                out.append([short_name(row[1]), None, []])
            elif row[0] == "Address":
                header = row
                out[-1][1] = header
            elif out:
                out[-1][2].append(row)
    return out


def number(row, idx, key):
    try:
        return float(row[idx[key]] or 0)
    except (KeyError, ValueError, IndexError):
        return 0.0


def summary(funcs, top):
    agg = collections.OrderedDict()
    for name, header, rows in funcs:
        idx = {h: i for i, h in enumerate(header)}
        stalls = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
        a = agg.setdefault(name, {"samples": 0.0, "executed": 0.0, "footprint": set(), "stalls": collections.Counter()})
        for r in rows:
            a["samples"] += number(r, idx, "Warp Stall Sampling (All Samples)")
            executed = number(r, idx, "Instructions Executed")
            a["executed"] += executed
            if executed > 0:
                a["footprint"].add(r[idx["Address"]])
            for k in stalls:
                a["stalls"][k[len("stall_"):]] += number(r, idx, k)
    total = sum(a["samples"] for a in agg.values()) or 1.0
    print(f"{'function':30s} {'samples %':>9s} {'instr (M)':>9s} {'code KB':>7s}  top stalls (% of the function's samples)")
    for name, a in sorted(agg.items(), key=lambda kv: -kv[1]["samples"]):
        s = a["samples"] or 1.0
        top_stalls = ", ".join(f"{k} {100 * v / s:.0f}" for k, v in a["stalls"].most_common(top))
        print(f"{name:30s} {100 * a['samples'] / total:9.1f} {a['executed'] / 1e6:9.2f} {16 * len(a['footprint']) / 1024:7.1f}  {top_stalls}")


def hot(funcs, want, top):
    runs = []
    for name, header, rows in funcs:
        if name != want:
            continue
        idx = {h: i for i, h in enumerate(header)}
        for r in rows:
            executed = number(r, idx, "Instructions Executed")
            samples = number(r, idx, "Warp Stall Sampling (All Samples)")
            no_inst = number(r, idx, "stall_no_inst")
            if runs and runs[-1]["executed"] == executed:
                runs[-1]["n"] += 1
                runs[-1]["samples"] += samples
                runs[-1]["no_inst"] += no_inst
            else:
                runs.append({"address": r[idx["Address"]], "first": r[idx["Source"]].strip(), "n": 1, "executed": executed,
                             "samples": samples, "no_inst": no_inst})
    instructions = sum(x["n"] * x["executed"] for x in runs) or 1.0
    samples = sum(x["samples"] for x in runs) or 1.0
    print(f"{want}: {instructions / 1e6:.2f} M warp instructions, {samples:.0f} samples")
    print(f"{'address':>14s} {'length':>6s} {'runs':>8s} {'instr %':>7s} {'samples %':>9s} {'no inst %':>9s}  first instruction")
    for x in sorted(runs, key=lambda x: -x["n"] * x["executed"])[:top]:
        print(f"{x['address']:>14s} {x['n']:6d} {x['executed']:8.0f} {100 * x['n'] * x['executed'] / instructions:7.1f} "
              f"{100 * x['samples'] / samples:9.1f} {100 * x['no_inst'] / samples:9.1f}  {x['first'][:48]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--hot", help="a function name as the summary prints it")
    ap.add_argument("--top", type=int, default=6)
    a = ap.parse_args()
    funcs = functions(a.csv)
    if a.hot:
        hot(funcs, a.hot, max(a.top, 20))
    else:
        summary(funcs, a.top)


if __name__ == "__main__":
    main()
