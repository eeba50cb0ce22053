"""Step-by-step comparison of pairs of [steps][vocab] fp32 logit files (A, B): relative L2 error
||A - B|| / ||A||, argmax and top-5 agreement per step, then over all pairs. Exits non-zero when
the argmax agrees on fewer than --min-argmax of all steps, a step's relative L2 error exceeds
--max-rel, or their median exceeds --max-median.

    compare.py VOCAB A_1 B_1 [A_2 B_2 ...] [--min-argmax 0.8] [--max-rel inf] [--max-median inf] [--quiet]
"""
import argparse
import math
import statistics
from array import array

parser = argparse.ArgumentParser()
parser.add_argument("vocab", type=int)
parser.add_argument("files", nargs="+")
parser.add_argument("--min-argmax", type=float, default=0.8)
parser.add_argument("--max-rel", type=float, default=float("inf"))
parser.add_argument("--max-median", type=float, default=float("inf"))
parser.add_argument("--quiet", action="store_true", help="the summary line only")
args = parser.parse_args()
steps = agree = 0
rels = []


def rows(path):
    """The file's logits as a list of per-step rows (plain Python: no numpy needed on the device)."""
    values = array("f")
    with open(path, "rb") as f:
        values.frombytes(f.read())
    return [values[i:i + args.vocab] for i in range(0, len(values), args.vocab)]


def argmax(row):
    return max(range(len(row)), key=row.__getitem__)


def top5(row):
    return set(sorted(range(len(row)), key=lambda i: -row[i])[:5])


for k in range(0, len(args.files), 2):
    a, b = rows(args.files[k]), rows(args.files[k + 1])
    if not args.quiet:
        print(f"\n{args.files[k]} vs {args.files[k + 1]}\n\n| step | rel L2 | argmax A / B | top-5 shared |\n|---|---|---|---|")
    for t in range(len(a)):
        diff = math.sqrt(sum((x - y) * (x - y) for x, y in zip(a[t], b[t])))
        rel = diff / math.sqrt(sum(x * x for x in a[t]))
        rels.append(rel)
        steps += 1
        agree += int(argmax(a[t]) == argmax(b[t]))
        if not args.quiet:
            print(f"| {t} | {rel:.4f} | {argmax(a[t])} / {argmax(b[t])} | {len(top5(a[t]) & top5(b[t]))} |")
median = statistics.median(rels)
ok = agree >= args.min_argmax * steps and max(rels) <= args.max_rel and median <= args.max_median
print(f"all: argmax agrees on {agree} of {steps} steps; relative L2 median {median:.4f}, max {max(rels):.4f}"
      f" ({'within' if ok else 'outside'} argmax >= {args.min_argmax:.0%}, rel L2 <= {args.max_rel},"
      f" median <= {args.max_median})")
raise SystemExit(0 if ok else 1)
