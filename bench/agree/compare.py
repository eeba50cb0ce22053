"""Step-by-step comparison of pairs of [steps][vocab] fp32 logit files (encore, llama.cpp): relative
L2 error, argmax and top-5 agreement per step, then over all pairs. Exits non-zero when the argmax
agrees on fewer than 80% of all steps or the median relative L2 error exceeds 0.1.

    compare.py VOCAB ENCORE_1 LLAMA_1 [ENCORE_2 LLAMA_2 ...]
"""
import sys

import numpy as np

vocab = int(sys.argv[1])
files = sys.argv[2:]
steps = agree = 0
rels = []
for k in range(0, len(files), 2):
    a = np.fromfile(files[k], dtype=np.float32).reshape(-1, vocab)
    b = np.fromfile(files[k + 1], dtype=np.float32).reshape(-1, vocab)
    print(f"\n{files[k]} vs {files[k + 1]}\n\n| step | rel L2 | argmax encore / llama.cpp | top-5 shared |\n|---|---|---|---|")
    for t in range(a.shape[0]):
        rel = float(np.linalg.norm(a[t] - b[t]) / np.linalg.norm(a[t]))
        rels.append(rel)
        shared = len(set(np.argsort(-a[t])[:5]) & set(np.argsort(-b[t])[:5]))
        steps += 1
        agree += int(a[t].argmax() == b[t].argmax())
        print(f"| {t} | {rel:.4f} | {a[t].argmax()} / {b[t].argmax()} | {shared} |")
median = float(np.median(rels))
print(f"\nall: argmax agrees on {agree} of {steps} steps; relative L2 median {median:.4f}, max {max(rels):.4f}")
sys.exit(0 if agree >= 0.8 * steps and median <= 0.1 else 1)
