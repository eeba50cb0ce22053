#!/usr/bin/env python3
"""Where a CUDA object's register spills sit: per device function, its local loads and stores
(LDL / STL) in all and inside innermost loops (a backward branch whose range holds no other).
Spills at a call boundary cost once per call; spills inside an inner loop cost every iteration.
With --all, every function with its code size (16 bytes an instruction), names demangled: the
megakernel's bodies are run_op<Opcode N, tokens> (pipeline/megakernel/program.cuh numbers the
opcodes), whose code an SM fetches again each call (docs/megakernel.md §4). Works on the CPU
machine. Usage:
  sass_spills.py [--all] [--match SUBSTRING] OBJECT.o [OBJECT.o ...]
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


def demangled(names):
    tool = shutil.which("c++filt")
    if not tool:
        return names
    out = subprocess.run([tool], input="\n".join(names), check=True, capture_output=True, text=True).stdout
    # (the separately compiled units' internal prefixes and anonymous namespaces say nothing)
    return [re.sub(r"_INTERNAL_\w+?::|\(anonymous namespace\)::", "", n) for n in out.splitlines()]


def main(argv):
    match, everything = None, False
    while len(argv) > 1 and argv[1] in ("--match", "--all"):
        if argv[1] == "--all":
            everything, argv = True, [argv[0]] + argv[2:]
        elif len(argv) > 2:
            match, argv = argv[2], [argv[0]] + argv[3:]
        else:
            break
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    tool = os.environ.get("CUOBJDUMP") or shutil.which("cuobjdump")
    if not tool:
        print("sass_spills: cuobjdump not found (set CUOBJDUMP)", file=sys.stderr)
        return 2
    print("instructions      KB  LDL (inner)  STL (inner)  function")
    for obj in argv[1:]:
        sass = subprocess.run([tool, "-sass", obj], check=True, capture_output=True, text=True).stdout
        found = functions(sass)
        for (name, body), readable in zip(found, demangled([n for n, _ in found])):
            if match and match not in name and match not in readable:
                continue
            n, ld, ld_in, st, st_in = spills(body)
            if ld or st or everything:
                print(f"{n:12d}  {n * 16 / 1024:6.1f}  {ld:4d} ({ld_in:4d})  {st:4d} ({st_in:4d})  {readable}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
