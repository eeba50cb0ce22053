#!/usr/bin/env bash
# One full verification pass on a GPU machine, in one call (device time is scarce): the whole
# test suite, compute-sanitizer (memcheck, racecheck, synccheck) over small cases of every area,
# every benchmark to JSON, and generation from GGUF files written on the machine (a full-width
# model against the fp64 reference, then the whole 28 GB preset's load time and tokens/s).
# Usage, from the repository root with `build/` built here:
#   bash bench/gpu_check.sh [OUT_DIR] [BENCH_FILTER] [GENERATE=1]
# Prints a short summary last; full logs go to OUT_DIR (default: $OUT, else ./out).
set -uo pipefail
out=${1:-${OUT:-out}}
filter=${2:-.}
generate=${3:-1}
mkdir -p "$out"
tests=build/tests

if ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu_check: no NVIDIA GPU here" >&2
  exit 1
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/device.txt"

ctest --test-dir build -j 8 -LE install --output-on-failure > "$out/ctest.log" 2>&1
echo "ctest rc=$? $(grep -E 'tests passed|tests failed' "$out/ctest.log")"
grep -E '\*\*\*Failed|Failure|actual:|out of bounds' "$out/ctest.log" | head -8

# Small cases that reach every kernel of each area (the invalidated-capture test is left out:
# it makes CUDA API errors on purpose).
declare -A small=(
  [gemv]='Shapes/*n37_k2304_b3:Shapes/*n37_k14336_b16:Shapes/Rms*n4096_k256_b16:Q4kGemvDeterminism*:Q4kGemvInPlace*'
  [q4k]='Q4kDequantizeGpu.*'
  [kda]='KdaGpu.OneStep*:KdaGpu.SlotIsolationAndPadding:KdaGpu.BadSlotIdsLeaveStatesUntouched'
  [mla]='MlaGpu.MixedBatchAllHeadCounts:MlaGpu.AppendRopePositionsAndNopeCopy:MlaGpu.BadDeviceInputLeavesCacheUntouched'
  [moe]='MoeTopkGpu.*:MoeRouterGpu.*:MoeExpertsGpu.Small*'
  [pipeline]='Tiny/MegakernelTiny.*:Tiny/MegakernelGpu.RunsInsideACapturedGraph*:Tiny/PipelineGpu.GraphReplaysMatchEagerStepsBitForBit*:GeneratorTiny.*:PipelineGpuWide.*:MegakernelTinyWide.*'
  [sample]='GreedyGpu.*'
)
export ENCORE_MEGAKERNEL_STEPS=4  # the megakernel's bit-identity tests, shortened under the sanitizers
for area in gemv q4k kda mla moe pipeline sample; do
  for tool in memcheck racecheck synccheck; do
    log="$out/${tool}_${area}.log"
    compute-sanitizer --tool "$tool" --error-exitcode 9 "$tests/encore_test_$area" --gtest_filter="${small[$area]}" > "$log" 2>&1
    echo "$tool $area rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -1)"
  done
done

unset ENCORE_MEGAKERNEL_STEPS
build/bench/encore_bench --benchmark_filter="$filter" --benchmark_min_time=0.02 \
  --benchmark_out="$out/bench.json" --benchmark_out_format=json > "$out/bench.log" 2>&1
echo "bench rc=$?"
python3 bench/summarize.py "$out/bench.json" > "$out/summary.txt" && head -1 "$out/summary.txt"

[ "$generate" = 1 ] || exit 0
# Generation from files written here (model files do not travel to this machine). 1: a full-width
# model of three layers (KDA dense, KDA MoE, MLA MoE) fed the reference's 16 tokens as a prompt, its
# logits on both paths against the fp64 reference with the device's int8 arithmetic; 2: the whole
# preset (28 GB): load time and tokens/s on both paths. The files go to /tmp and are deleted.
gen=/tmp/encore_gen
mkdir -p "$gen"
build/bench/encore_agree_model "$gen/fw.gguf" "$gen/fw_ref.bin" 16 1 layers=KdKeMe int8 > "$out/gen_ref.log" 2>&1
ids=$(grep '^prompt-ids ' "$out/gen_ref.log" | cut -d' ' -f2)
for path in graph megakernel; do
  build/bin/encore generate --model "$gen/fw.gguf" --prompt-ids "$ids" --steps 1 --path "$path" \
    --logits-out "$gen/fw_$path.bin" > "$out/gen_fw_$path.log" 2>&1
  echo "generate full-width $path rc=$? $(tail -1 "$out/gen_fw_$path.log")"
  python3 bench/agree/compare.py 163840 "$gen/fw_ref.bin" "$gen/fw_$path.bin" --min-argmax 0.95 --max-rel 0.02 --quiet
done
cmp -s "$gen/fw_graph.bin" "$gen/fw_megakernel.bin" && echo "full-width logits: graph and megakernel same bits" \
  || echo "full-width logits: graph and megakernel DIFFER"
rm -f "$gen/fw.gguf"
build/tests/encore_write_gguf "$gen/kimi.gguf" kimi 1 > "$out/gen_write.log" 2>&1
echo "write kimi rc=$? $(tail -1 "$out/gen_write.log")"
for path in graph megakernel; do
  build/bin/encore generate --model "$gen/kimi.gguf" --prompt-ids 1,2,3 --steps 64 --path "$path" > "$out/gen_kimi_$path.log" 2>&1
  echo "generate kimi $path rc=$? $(grep -a -o 'loaded .*GB/s)' "$out/gen_kimi_$path.log"); $(tail -1 "$out/gen_kimi_$path.log")"
done
rm -rf "$gen"
