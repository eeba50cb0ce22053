"""The critical path of a traced megakernel step (`encore_ab --trace --out DIR` writes
trace_b<B>_c<C>.csv and trace_b<B>_c<C>_blocks.csv).

It walks back from the instruction that ended last. At each instruction it takes the block that
ended last there. If that block arrived after the instruction's producers had ended, it was busy in
its previous instruction, and the walk steps back to that one. Otherwise the walk steps back to the
instruction's latest producer. Each instruction on the path contributes "run" (the block's release
to its signal) and "wait" (from the later of its producers' end and its own arrival, to its
release). Prints both, summed per instruction kind (the name without its layer). A second table
gives, per kind, the arrival-to-release time of the blocks that arrived after their producers had
ended: the body's prologue (weight copies started before the wait) plus one dependency check,
time the graph path hides under the previous kernel with PDL.

    critical_path.py DIR/trace_b1_c4096      (the two CSVs' common prefix)
"""
import collections
import csv
import sys


def load(prefix):
    instructions = {}
    for row in csv.DictReader(open(prefix + ".csv")):
        instructions[int(row["index"])] = {
            "name": row["name"],
            "end": float(row["end"]),
            "producers": [int(p) for p in row["producers"].split()],
        }
    blocks = collections.defaultdict(list)  # instruction -> [(block, start, ready, end)]
    for row in csv.DictReader(open(prefix + "_blocks.csv")):
        blocks[int(row["index"])].append((int(row["block"]), float(row["start"]), float(row["ready"]), float(row["end"])))
    return instructions, blocks


def kind(name):
    return name.split(".", 2)[-1] if name.startswith("blk.") else name


def critical_path(instructions, blocks):
    by_block = collections.defaultdict(list)  # block -> [(end, instruction)], to find what a block ran before
    for i, entries in blocks.items():
        for block, _, _, end in entries:
            by_block[block].append((end, i))
    i = max(instructions, key=lambda k: instructions[k]["end"])
    path = []
    while True:
        block, start, ready, end = max(blocks[i], key=lambda e: e[3])
        producers_end = max((instructions[p]["end"] for p in instructions[i]["producers"]), default=0.0)
        path.append((i, max(0.0, ready - max(producers_end, start)), end - ready))  # (instruction, wait, run)
        if start > producers_end + 0.05:  # the block was busy in its previous instruction
            earlier = [(e, j) for e, j in by_block[block] if e <= start + 1e-6 and j != i]
            if not earlier:
                break
            i = max(earlier)[1]
        elif instructions[i]["producers"]:
            i = max(instructions[i]["producers"], key=lambda p: instructions[p]["end"])
        else:
            break
    return path


def main():
    instructions, blocks = load(sys.argv[1])
    path = critical_path(instructions, blocks)
    step_end = max(v["end"] for v in instructions.values())
    wait = sum(p[1] for p in path)
    run = sum(p[2] for p in path)
    print(f"step end {step_end:.1f} us; critical path: {len(path)} instructions, run {run:.0f} us, wait {wait:.0f} us")
    totals = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for i, w, r in path:
        t = totals[kind(instructions[i]["name"])]
        t[0] += 1
        t[1] += r
        t[2] += w
    print("\n| instruction | on the path | run us | wait us |\n|---|---|---|---|")
    for name, (count, r, w) in sorted(totals.items(), key=lambda item: -(item[1][1] + item[1][2])):
        print(f"| {name} | {count} | {r:.1f} | {w:.1f} |")
    prologues(instructions, blocks)


def prologues(instructions, blocks):
    times = collections.defaultdict(list)
    for i, entries in blocks.items():
        producers_end = max((instructions[p]["end"] for p in instructions[i]["producers"]), default=0.0)
        for _, start, ready, _ in entries:
            if start >= producers_end:
                times[kind(instructions[i]["name"])].append(ready - start)
    print("\n| instruction | blocks arriving after their producers | arrival -> release, median us |\n|---|---|---|")
    for name, t in sorted(times.items(), key=lambda item: -sorted(item[1])[len(item[1]) // 2]):
        print(f"| {name} | {len(t)} | {sorted(t)[len(t) // 2]:.2f} |")


if __name__ == "__main__":
    main()
