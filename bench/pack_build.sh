#!/usr/bin/env bash
# Packs build/ for a GPU machine that has the source tree but not the build (the device tool
# carries at most 64 MiB): every binary and test file, no object files or static libraries, in one
# solid xz archive, whose 64 MB window shares the megakernel's code between the test and bench
# binaries (about 17 MB for 180 MB). bench/gpu_check.sh unpacks it where build/ is missing.
# Usage, from the repository root after building: bash bench/pack_build.sh [ARCHIVE]
# (default build_pack/build.tar.xz; build*/ is git-ignored).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-build_pack/build.tar.xz}
mkdir -p "$(dirname "$out")"
tar -cf - --exclude='*.o' --exclude='*.a' --exclude=CMakeFiles build | xz -T1 -9 > "$out"
ls -l "$out"
