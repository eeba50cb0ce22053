#!/usr/bin/env bash
# Builds build_var/ for 2026-12-08-moe-down-variants.sh (CPU, about 10 minutes on 2 cores): a
# worktree of HEAD at ../encore-var with 2026-12-08-moe-down-variants.patch applied, one build
# per variant (the macros defined at the top of ops/moe/moe.cu only), the binaries suffixed and
# packed with xz across them. Then: run(command="bash build_var/run.sh", carry=["build_var"]).
set -euo pipefail
repo=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
wt=${WT:-$repo/../encore-var}
cd "$repo"
[ -d "$wt" ] || git worktree add --detach "$wt" HEAD
git -C "$wt" checkout -q --detach "$(git rev-parse HEAD)" && git -C "$wt" reset -q --hard
git -C "$wt" apply "$repo/bench/notes/2026-12-08-moe-down-variants.patch"
cmake -S "$wt" -B "$wt/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DENCORE_BUILD_CLI=OFF >/dev/null
out=$repo/build_var; rm -rf "$out"; mkdir -p "$out/bin"
cp "$wt/ops/moe/moe.cu" "$wt/build/moe.cu.patched"
# variant: ENCORE_X_DOT ENCORE_X_DOWN3 (see the run script's header)
declare -A DOT=([0]=0 [1]=1 [2]=2 [3]=3 [4]=4 [5]=0 [6]=3 [7]=7 [8]=7 [9]=9) DOWN3=([0]=0 [1]=0 [2]=0 [3]=0 [4]=0 [5]=1 [6]=1 [7]=0 [8]=1 [9]=0)
for v in 0 1 2 3 4 5 6 7 8 9; do
  { echo "#define ENCORE_X_DOT ${DOT[$v]}"; echo "#define ENCORE_X_DOWN3 ${DOWN3[$v]}"; cat "$wt/build/moe.cu.patched"; } > "$wt/ops/moe/moe.cu"
  ninja -C "$wt/build" encore_bench encore_ab encore_test_moe $([ $v = 0 ] && echo encore_expert_ring_probe) >/dev/null
  for b in encore_bench encore_ab encore_test_moe; do cp "$(find "$wt/build" -name $b -type f -perm -u+x | head -1)" "$out/bin/${b}_v$v"; done
  [ $v = 0 ] && cp "$(find "$wt/build" -name encore_expert_ring_probe -type f -perm -u+x | head -1)" "$out/bin/"
  echo "variant $v built"
done
cp "$wt/build/moe.cu.patched" "$wt/ops/moe/moe.cu"
# shared libraries the device machine may lack (Google Benchmark, GoogleTest)
ldd "$out/bin/encore_bench_v0" "$out/bin/encore_test_moe_v0" | awk '/libbenchmark|libgtest|libgmock/ {print $3}' | sort -u | xargs -r -I{} cp -L {} "$out/bin/"
(cd "$out/bin" && tar -cf - . | xz -T1 --lzma2=preset=9,dict=512MiB > ../vars.tar.xz) && rm -rf "$out/bin"
cp "$repo/bench/notes/2026-12-08-moe-down-variants.sh" "$out/run.sh"
ls -la "$out"
