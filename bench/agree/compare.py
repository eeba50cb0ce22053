"""Step-by-step comparison of pairs of [steps][vocab] fp32 logit files (A, B): relative L2 error
||A - B|| / ||A||, argmax and top-5 agreement per step, then over all pairs. Exits non-zero when
the argmax agrees on fewer than --min-argmax of all steps or a step's relative L2 error exceeds
--max-rel.

    compare.py VOCAB A_1 B_1 [A_2 B_2 ...] [--min-argmax 0.8] [--max-rel inf] [--quiet]
"""
import argparse

import numpy as np

parser = argparse.ArgumentParser()
parser.add_argument("vocab", type=int)
parser.add_argument("files", nargs="+")
parser.add_argument("--min-argmax", type=float, default=0.8)
parser.add_argument("--max-rel", type=float, default=float("inf"))
parser.add_argument("--quiet", action="store_true", help="the summary line only")
args = parser.parse_args()
steps = agree = 0
rels = []
for k in range(0, len(args.files), 2):
    a = np.fromfile(args.files[k], dtype=np.float32).reshape(-1, args.vocab)
    b = np.fromfile(args.files[k + 1], dtype=np.float32).reshape(-1, args.vocab)
    if not args.quiet:
        print(f"\n{args.files[k]} vs {args.files[k + 1]}\n\n| step | rel L2 | argmax A / B | top-5 shared |\n|---|---|---|---|")
    for t in range(a.shape[0]):
        rel = float(np.linalg.norm(a[t] - b[t]) / np.linalg.norm(a[t]))
        rels.append(rel)
        shared = len(set(np.argsort(-a[t])[:5]) & set(np.argsort(-b[t])[:5]))
        steps += 1
        agree += int(a[t].argmax() == b[t].argmax())
        if not args.quiet:
            print(f"| {t} | {rel:.4f} | {a[t].argmax()} / {b[t].argmax()} | {shared} |")
median = float(np.median(rels))
ok = agree >= args.min_argmax * steps and max(rels) <= args.max_rel
print(f"all: argmax agrees on {agree} of {steps} steps; relative L2 median {median:.4f}, max {max(rels):.4f}"
      f" ({'within' if ok else 'outside'} argmax >= {args.min_argmax:.0%}, rel L2 <= {args.max_rel})")
raise SystemExit(0 if ok else 1)
