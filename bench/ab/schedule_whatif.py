"""What-if replays of a traced megakernel step's MoE layers (`encore_ab --trace --out DIR` writes
trace_b<B>_c<C>.csv, _blocks.csv and _marks.csv): how much sooner each layer's routed gate/up or
down would end under another scheduling rule, before anyone builds it.

Each block keeps its own arrival, release and set-up times and the median item time and tail of
its instruction; only the rule that gives items to blocks changes:

  pass waits   down item i waits for the gate/up items of its own expert (pass i / 36: their last
               item end, plus --handoff us) instead of the whole gate/up instruction; its set-up
               (list, ring, activations) runs before.
  dynamic      items handed out in arrival order: the next free block takes the next item (down
               items still wait for all of gate/up, plus --handoff), its weights land --latency us
               after it takes it.

An item's time is held fixed, so these are upper bounds: moving items between lanes changes how
many bytes each SM streams at once, and the placement tries in bench/notes/ (2026-12-06) found items
slower where lanes took more of them.

Usage: python3 bench/ab/schedule_whatif.py DIR/trace_b1_c4096 [--handoff 1.0] [--latency 1.5]
"""
import argparse
import collections
import csv
import heapq
import statistics

GATE_UP_ROW_GROUPS, DOWN_ROW_CHUNKS = 32, 36  # items per pass (Kimi: inter 1024 / 32, hidden 2304 / 64)


def load(prefix):
    ins = list(csv.DictReader(open(f"{prefix}.csv")))
    blocks = collections.defaultdict(dict)
    for r in csv.DictReader(open(f"{prefix}_blocks.csv")):
        blocks[int(r["index"])][int(r["block"])] = (float(r["start"]), float(r["ready"]), float(r["end"]))
    marks = collections.defaultdict(lambda: collections.defaultdict(list))
    for r in csv.DictReader(open(f"{prefix}_marks.csv")):
        marks[int(r["index"])][int(r["block"])].append((r["mark"], int(r["item"]), float(r["us"])))
    return ins, blocks, marks


def item_spans(ms):
    begin = {k: t for m, k, t in ms if m == "item_begin"}
    end = {k: t for m, k, t in ms if m == "item_end"}
    return {k: (begin[k], end[k]) for k in begin if k in end}


def first_mark(ms, name, default):
    return next((t for m, _, t in ms if m == name), default)


def lanes_of(row, grid):
    """The blocks an instruction runs on (traces before the lanes column: one per tile, up to the grid)."""
    return int(row["lanes"]) if row.get("lanes") else min(grid, int(row["tiles"]))


def pass_waits(ins, blocks, marks, gi, si, di, grid, handoff):
    """Down's end with per-pass waits (us), from the gate/up items' ends."""
    done = collections.defaultdict(float)
    for idx, per_pass in ((gi, GATE_UP_ROW_GROUPS), (si, None)):
        if idx is None:
            continue
        first, lanes = int(ins[idx]["first_block"]), lanes_of(ins[idx], grid)
        for b, ms in marks[idx].items():
            for k, (_, end) in item_spans(ms).items():
                item = (b - first) % grid + k * lanes
                p = item // per_pass if per_pass else "shared"
                done[p] = max(done[p], end)
    routed = [p for p in done if p != "shared"]
    if "shared" in done:
        done[max(routed, default=-1) + 1] = done.pop("shared")  # the shared experts' pass is the last
    first, lanes = int(ins[di]["first_block"]), lanes_of(ins[di], grid)
    end_all = 0.0
    for b, ms in marks[di].items():
        start, ready, end = blocks[di][b]
        spans = item_spans(ms)
        t = first_mark(ms, "ring_started", start) + (first_mark(ms, "stream_ready", ready) - ready)
        for k in sorted(spans):
            item = (b - first) % grid + k * lanes
            t = max(t, done.get(item // DOWN_ROW_CHUNKS, 0.0) + handoff) + (spans[k][1] - spans[k][0])
        last = max((e for _, e in spans.values()), default=t)
        end_all = max(end_all, t + (end - last))
    return end_all


def dynamic(ins, blocks, marks, idx, not_before, latency, setup_mark):
    """The instruction's end (us) with items handed out in arrival order."""
    spans, setups, tails, free = [], [], [], []
    for b, ms in marks[idx].items():
        start, ready, end = blocks[idx][b]
        s = item_spans(ms)
        spans += [e - a for a, e in s.values()]
        mark = first_mark(ms, setup_mark, None)
        if mark is not None:
            setups.append(mark - (start if setup_mark == "list_built" else ready))
        if s:
            tails.append(end - max(e for _, e in s.values()))
        free.append((start if setup_mark == "list_built" else ready, b))
    if not spans:
        return None
    item, setup, tail = statistics.median(spans), statistics.median(setups or [0.0]), statistics.median(tails or [0.0])
    free = [(t + setup, b) for t, b in free]
    heapq.heapify(free)
    ends = {}
    for _ in range(len(spans)):
        t, b = heapq.heappop(free)
        e = max(t + latency, not_before) + item
        ends[b] = e
        heapq.heappush(free, (e, b))
    return max(e + tail for e in ends.values())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("prefix", help="the trace's path without .csv (DIR/trace_b1_c4096)")
    ap.add_argument("--handoff", type=float, default=1.0, help="a pass's last signal -> a waiting item's data (us)")
    ap.add_argument("--latency", type=float, default=1.5, help="a handed-out item's weights: taken -> landed (us)")
    a = ap.parse_args()
    ins, blocks, marks = load(a.prefix)
    grid = max(len(v) for v in blocks.values())
    gains = collections.defaultdict(list)
    for di, r in enumerate(ins):
        if not r["name"].endswith("moe.down"):
            continue
        layer = r["name"][: -len("moe.down")]
        gi = next((j for j in range(di) if ins[j]["name"] == layer + "moe.gate_up"), None)
        si = next((j for j in range(di) if ins[j]["name"] == layer + "moe.shared_gate_up"), None)
        if gi is None:
            continue
        down_end, gate_up_end = float(r["end"]), float(ins[gi]["end"])
        gains["down, pass waits"].append(down_end - pass_waits(ins, blocks, marks, gi, si, di, grid, a.handoff))
        d = dynamic(ins, blocks, marks, di, gate_up_end + a.handoff, a.latency, "list_built")
        if d is not None:
            gains["down, dynamic"].append(down_end - d)
        g = dynamic(ins, blocks, marks, gi, 0.0, 0.0, "stream_ready")
        if g is not None:
            gains["routed gate/up, dynamic"].append(gate_up_end - g)
    print(f"{'rule':26s} {'layers':>6s} {'median us sooner':>16s} {'sum us':>8s}")
    for rule, v in gains.items():
        print(f"{rule:26s} {len(v):6d} {statistics.median(v):16.2f} {sum(v):8.0f}")


if __name__ == "__main__":
    main()
