#!/usr/bin/env python3
"""Where a CUDA object's register spills sit: per device function, its local loads and stores
(LDL / STL) in all and inside innermost loops (a backward branch whose range holds no other).
Spills at a call boundary cost once per call; spills inside an inner loop cost every iteration.
Works on the CPU machine. Usage:
  sass_spills.py [--match SUBSTRING] OBJECT.o [OBJECT.o ...]
Needs cuobjdump (CUDA toolkit, or the PyPI wheel nvidia-cuda-cuobjdump): $CUOBJDUMP or PATH."""
import os
import re
import shutil
import subprocess
import sys

INSTR = re.compile(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);")
BRANCH = re.compile(r"\bBRA\b.*?0x([0-9a-f]+)")


def functions(sass):
    out, name, body = [], None, []
    for line in sass.splitlines():
        m = re.search(r"Function : (\S+)", line)
        if m:
            if name:
                out.append((name, body))
            name, body = m.group(1), []
            continue
        m = INSTR.match(line)
        if name and m:
            body.append((int(m.group(1), 16), m.group(2)))
    if name:
        out.append((name, body))
    return out


def spills(body):
    loops = []
    for at, text in body:
        m = BRANCH.search(text)
        if m and int(m.group(1), 16) < at:
            loops.append((int(m.group(1), 16), at))
    inner = [l for l in loops if not any(o != l and l[0] <= o[0] and o[1] <= l[1] for o in loops)]
    in_inner = lambda at: any(s <= at <= e for s, e in inner)
    loads = [at for at, t in body if re.search(r"\bLDL\b", t)]
    stores = [at for at, t in body if re.search(r"\bSTL\b", t)]
    return len(body), len(loads), sum(map(in_inner, loads)), len(stores), sum(map(in_inner, stores))


def main(argv):
    match = None
    if len(argv) > 2 and argv[1] == "--match":
        match, argv = argv[2], [argv[0]] + argv[3:]
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    tool = os.environ.get("CUOBJDUMP") or shutil.which("cuobjdump")
    if not tool:
        print("sass_spills: cuobjdump not found (set CUOBJDUMP)", file=sys.stderr)
        return 2
    print("instructions  LDL (inner)  STL (inner)  function")
    for obj in argv[1:]:
        sass = subprocess.run([tool, "-sass", obj], check=True, capture_output=True, text=True).stdout
        for name, body in functions(sass):
            if match and match not in name:
                continue
            n, ld, ld_in, st, st_in = spills(body)
            if ld or st:
                print(f"{n:12d}  {ld:4d} ({ld_in:4d})  {st:4d} ({st_in:4d})  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
