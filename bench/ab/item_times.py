"""Item times inside a traced megakernel step (`encore_ab --trace --out DIR` writes
trace_b<B>_c<C>.csv, _blocks.csv and _marks.csv).

The bodies mark, on each block, when an expert stream's work list and item table were built
(list_built), its first weights issued (ring_started) and its set-up ended (activations), when each item began, when warp 0 had the item's first weights, when warp 0
was done with the item's weights, when the block was done with it (after the epilogue and the block
barrier; with the ns warp 0 waited for weights in it), and when the down stream's ordered combine
began; the GEMVs mark their tiles' begin and end (warp 0's view), and the dp4a core (up to 4
tokens) its tile's first weights (item_weights, with warp 0's wait in ns) and its K loop's end
(item_computed). Per instruction kind (the name
without its layer), summed over layers, this prints:

  blocks      block entries that ran the kind
  items       items per block entry: mean and max
  wait        arrival -> release (producers), median per block entry, us
  setup       release -> stream ready (expert streams), median, us
  first       item begin -> its first weights, median, us
  item        item begin -> end, median and 90th percentile, us
  weights%    share of the items' time warp 0 spent waiting for weights
  epilogue%   share of the items' time from warp 0's last weights to the item's end (the
              epilogue, and the block barrier: the slowest warp)
  tail        last item end -> the block's signal, median, us
  GB/s        (with --item-bytes) the kind's item bytes over the span from its first item begin to
              its last item end, per instruction, median over layers

Then, per kind, its phases: every block entry's events in time order (arrive, release = the
producers' wait returned, signal, and the marks), and the median time between each pair of
consecutive events, in the order they first occur. For KDA: begin (before the prologue) ->
stream_ready (the prologue's loads issued) -> release -> item_weights (gate weights and proj
landed) -> item_computed (state pass) -> item_end; for split-KV: begin -> stream_ready (settled pages'
copies issued) -> release -> item_weights (query and first page landed) -> item_computed (pages) ->
item_end (output or partial stored).

With --layer L, the blocks of layer L's instructions of the kinds named by --kinds, one line per
block: arrival, release, stream ready, each item's begin / end, signal (us from the launch).

    item_times.py DIR/trace_b1_c4096 [--item-bytes moe.gate_up=82944,moe.down=36864]
                                     [--layer 10 --kinds moe.shared_gate_up,moe.gate_up,moe.down]
"""
import argparse
import collections
import csv
import os
import statistics

from critical_path import kind  # an instruction's kind: its name without the layer


def layer(name):
    parts = name.split(".")
    return int(parts[1]) if name.startswith("blk.") and parts[1].isdigit() else -1


def load(prefix):
    names = {int(r["index"]): r["name"] for r in csv.DictReader(open(prefix + ".csv"))}
    blocks = {}  # (instruction, block) -> (start, ready, end)
    for r in csv.DictReader(open(prefix + "_blocks.csv")):
        blocks[(int(r["index"]), int(r["block"]))] = (float(r["start"]), float(r["ready"]), float(r["end"]))
    marks = collections.defaultdict(list)  # (instruction, block) -> [(mark, item, us, value)] in order
    if not os.path.exists(prefix + "_marks.csv"):  # (a trace from before the marks: block times only)
        return names, blocks, marks
    for r in csv.DictReader(open(prefix + "_marks.csv")):
        marks[(int(r["index"]), int(r["block"]))].append((r["mark"], int(r["item"]), float(r["us"]), int(r["value"])))
    return names, blocks, marks


def items_of(entry_marks):
    """{item: {"begin", "weights", "computed", "end", "waited_us"}} and the stream-ready time (or None)."""
    items = collections.defaultdict(dict)
    ready = None
    for mark, item, us, value in entry_marks:
        if mark == "stream_ready":
            ready = us
        elif mark == "item_begin":
            items[item]["begin"] = us
        elif mark == "item_weights":
            items[item]["weights"] = us
        elif mark == "item_computed":
            items[item]["computed"] = us
        elif mark == "item_end":
            items[item]["end"] = us
            items[item]["waited_us"] = value * 1e-3
    return items, ready


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def pct(xs, q):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def summary(names, blocks, marks, item_bytes):
    per_kind = collections.defaultdict(lambda: collections.defaultdict(list))
    spans = collections.defaultdict(lambda: [float("inf"), 0.0, 0])  # instruction -> [first begin, last end, items]
    for (i, b), (start, ready, end) in blocks.items():
        k = kind(names[i])
        s = per_kind[k]
        items, stream_ready = items_of(marks.get((i, b), []))
        s["entries"].append(1)
        s["wait"].append(ready - start)
        if stream_ready is not None:
            s["setup"].append(stream_ready - ready)
        if not items:
            continue
        s["items"].append(len(items))
        last_end = 0.0
        for it in items.values():
            if "begin" not in it or "end" not in it:
                continue
            s["item"].append(it["end"] - it["begin"])
            if "weights" in it:  # (the expert streams; the GEMVs mark only begin and end)
                s["first"].append(it["weights"] - it["begin"])
                s["waited"].append(it["waited_us"])
                s["timed"].append(it["end"] - it["begin"])
            if "computed" in it:
                s["epilogue"].append(it["end"] - it["computed"])
                s["etimed"].append(it["end"] - it["begin"])
            last_end = max(last_end, it["end"])
            sp = spans[i]
            sp[0], sp[1], sp[2] = min(sp[0], it["begin"]), max(sp[1], it["end"]), sp[2] + 1
        s["tail"].append(end - last_end)
    print(f"{'kind':<22} {'blocks':>6} {'items':>9} {'wait':>7} {'setup':>7} {'first':>7} {'item':>15} {'weights%':>8} "
          f"{'epilogue%':>9} {'tail':>7} {'GB/s':>7}")
    for k in sorted(per_kind, key=lambda k: -sum(per_kind[k]["item"])):
        s = per_kind[k]
        if not s["items"]:
            continue
        items = f"{statistics.mean(s['items']):.1f}/{max(s['items'])}"
        # (KDA marks its weights' landing but keeps no wait time: nan)
        weights = 100.0 * sum(s["waited"]) / sum(s["timed"]) if any(s["waited"]) and sum(s["timed"]) > 0 else float("nan")
        epilogue = 100.0 * sum(s["epilogue"]) / sum(s["etimed"]) if s["etimed"] and sum(s["etimed"]) > 0 else float("nan")
        gbs = float("nan")
        if k in item_bytes:
            rates = [n * item_bytes[k] / ((e - b) * 1e3) for i, (b, e, n) in spans.items() if kind(names[i]) == k and e > b]
            gbs = median(rates)
        print(f"{k:<22} {len(s['entries']):>6} {items:>9} {median(s['wait']):>7.2f} {median(s['setup']):>7.2f} "
              f"{median(s['first']):>7.2f} {median(s['item']):>7.2f} /{pct(s['item'], 0.9):>6.2f} {weights:>8.1f} {epilogue:>9.1f} "
              f"{median(s['tail']):>7.2f} {gbs:>7.0f}")


def phases(names, blocks, marks, kinds):
    order = {"arrive": 0, "release": 2, "signal": 9}
    per_kind = collections.defaultdict(lambda: collections.defaultdict(list))  # kind -> (a, b) -> [us]
    first_seen = collections.defaultdict(dict)  # kind -> (a, b) -> first position
    entries = collections.Counter()
    for (i, b), (start, ready, end) in blocks.items():
        k = kind(names[i])
        if kinds and k not in kinds:
            continue
        entries[k] += 1
        events = [(start, order["arrive"], "arrive"), (ready, order["release"], "release"), (end, order["signal"], "signal")]
        events += [(us, 1, m) for m, _, us, _ in marks.get((i, b), [])]
        events.sort(key=lambda e: (e[0], e[1]))
        for n, ((ta, _, a), (tb, _, bname)) in enumerate(zip(events, events[1:])):
            per_kind[k][(a, bname)].append(tb - ta)
            first_seen[k].setdefault((a, bname), (n, len(first_seen[k])))  # position in the first sequence it met
    for k in sorted(per_kind):
        pairs = sorted(per_kind[k], key=lambda ab: first_seen[k][ab])
        common = [ab for ab in pairs if len(per_kind[k][ab]) * 10 >= entries[k]]  # in 10% of the entries or more
        steps = [f"{a}->{b} {median(per_kind[k][(a, b)]):.2f}" for a, b in common]
        print(f"{k:<22} " + ", ".join(steps[:12]))


def timeline(names, blocks, marks, at_layer, kinds):
    for (i, b) in sorted(blocks, key=lambda ib: (ib[0], blocks[ib][2])):
        name = names[i]
        if layer(name) != at_layer or kind(name) not in kinds:
            continue
        start, ready, end = blocks[(i, b)]
        items, stream_ready = items_of(marks.get((i, b), []))
        parts = [f"{name:<28} block {b:>3}: arrive {start:9.2f} release {ready:9.2f}"]
        if stream_ready is not None:
            parts.append(f"ready {stream_ready:9.2f}")
        for k in sorted(items):
            it = items[k]
            parts.append(f"[{k}: {it.get('begin', float('nan')):.2f}-{it.get('end', float('nan')):.2f}]")
        parts.append(f"signal {end:9.2f}")
        print(" ".join(parts))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("prefix", help="DIR/trace_b<B>_c<C> (the CSVs' common prefix)")
    ap.add_argument("--item-bytes", default="", help="kind=bytes,...: the weight bytes of one item, for GB/s")
    ap.add_argument("--layer", type=int, default=-1, help="print this layer's blocks, one line each")
    ap.add_argument("--kinds", default="moe.shared_gate_up,moe.gate_up,moe.down", help="kinds for --layer")
    ap.add_argument("--phases", default="kda,kda.in_proj,moe.gate_up,moe.down,mla.splitkv",
                    help="kinds whose phases to print ('' for all)")
    a = ap.parse_args()
    item_bytes = {k: float(v) for k, v in (kv.split("=") for kv in a.item_bytes.split(",") if kv)}
    names, blocks, marks = load(a.prefix)
    summary(names, blocks, marks, item_bytes)
    print()
    phases(names, blocks, marks, set(a.phases.split(",")) - {""})
    if a.layer >= 0:
        print()
        timeline(names, blocks, marks, a.layer, set(a.kinds.split(",")))


if __name__ == "__main__":
    main()
