#!/usr/bin/env bash
# One full verification pass on a GPU machine, in one call (device time is scarce): the whole
# test suite, compute-sanitizer (memcheck, racecheck, synccheck) over small cases of every area,
# and every benchmark to JSON (generation from GGUF files: bench/generate_check.sh, a call of its
# own). Usage, from the repository root with `build/` built here
# (or packed by bench/pack_build.sh):
#   bash bench/gpu_check.sh [OUT_DIR] [BENCH_FILTER]
# Prints a short summary last; full logs go to OUT_DIR (default: $OUT, else ./out).
# PARTS (default "tests sanitizers bench") picks the parts, so the work can be split across calls
# of the device's 10-minute limit, e.g. PARTS="tests sanitizers" then PARTS=bench; AREAS (default:
# every area below) picks the sanitizers' areas, e.g. AREAS="pipeline megakernel sample";
# SANITIZER_TIMEOUT_S bounds each sanitizer run (rc 124), so a long one still leaves its log.
# PARTS=items (not a default) traces the megakernel on Kimi-Linear at 4K (batches 1, 4, 16) and
# prints its items' times (bench/ab/item_times.py) and critical path.
set -uo pipefail
out=${1:-${OUT:-out}}
filter=${2:-.}
mkdir -p "$out"
tests=build/tests

# A build packed elsewhere (bench/pack_build.sh) is unpacked where build/ is missing.
if [ ! -d build/tests ] && [ -f build_pack/build.tar.xz ]; then tar -xJf build_pack/build.tar.xz; fi

if ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu_check: no NVIDIA GPU here" >&2
  exit 1
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/device.txt"

parts=${PARTS:-tests sanitizers bench}
has() { [[ " $parts " == *" $1 "* ]]; }

if has tests; then
  ctest --test-dir build -j 8 -LE install --output-on-failure > "$out/ctest.log" 2>&1
  echo "ctest rc=$? $(grep -E 'tests passed|tests failed' "$out/ctest.log")"
  grep -E '\*\*\*Failed|Failure|actual:|out of bounds' "$out/ctest.log" | head -8
fi

# Small cases that reach every kernel of each area (the invalidated-capture test is left out:
# it makes CUDA API errors on purpose). The megakernel's cases live in the pipeline's binary.
declare -A small=(
  [gemv]='Shapes/*n37_k2304_b3:Shapes/*n37_k14336_b16:Shapes/Rms*n4096_k256_b16:F16/*n37_k2304_b5_f16:F16/*n37_k256_b16_f16:F16Parts/*n37_k2304_b16_f16_p1:Cores/Q4kGemvDeterminism*:Q4kGemvInPlace*:F16/Q4kGemvImage*'
  [q4k]='Q4kDequantizeGpu.*'
  [kda]='KdaGpu.OneStep*:KdaGpu.SlotIsolationAndPadding:KdaGpu.BadSlotIdsLeaveStatesUntouched'
  [mla]='MlaGpu.MixedBatchAllHeadCounts:MlaGpu.AppendRopePositionsAndNopeCopy:MlaGpu.BadDeviceInputLeavesCacheUntouched:MlaGpu.HalfSm*:MlaGpu.AbsorbAndAppend*'
  [moe]='MoeTopkGpu.*:MoeRouterGpu.*:MoeExpertsGpu.Small*'
  [pipeline]='Tiny/PipelineGpu.GraphReplaysMatchEagerStepsBitForBit*:GeneratorTiny.*:PipelineGpuWide.*:PipelineGpuInputs.GatherAndScheduler*'
  [megakernel]='Tiny/MegakernelTiny.*:Tiny/MegakernelTwoPerSm.*:Tiny/MegakernelGpu.RunsInsideACapturedGraph*:Tiny/MegakernelGpu.TraceTimesAndMarksAreOrdered*:MegakernelTinyWide.*'
  [sample]='GreedyGpu.*'
)
sanitize() {
  local tool=$1 area=$2 log="$out/${1}_${2}.log" cases=${small[$2]} binary=encore_test_${2/megakernel/pipeline}
  # racecheck takes minutes per 40-row step test (the tiny ones reach the same kernels), and the
  # generator's 146-step test grows its host memory past 128 GB; synccheck leaves that test's graph
  # launches untracked ("Unable to allocate enough memory"), each counted as an error
  [ "$tool" = racecheck ] && cases=$(tr ':' '\n' <<< "$cases" | grep -v Wide | paste -sd:)
  [ "$tool" != memcheck ] && [ "$area" = pipeline ] && cases=$cases-GeneratorTiny.BothPaths*
  timeout "${SANITIZER_TIMEOUT_S:-0}" compute-sanitizer --tool "$tool" --error-exitcode 9 "$tests/$binary" --gtest_filter="$cases" > "$log" 2>&1
  echo "$tool $area rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -1) untracked launches: $(grep -c 'Unable to allocate' "$log")"
}
# One tool at a time: sanitizers running side by side ran out of the 80 GB of an H100.
if has sanitizers; then
  export ENCORE_MEGAKERNEL_STEPS=4  # the megakernel's bit-identity tests, shortened under the sanitizers
  # and their waits bounded at 60 s: under racecheck a producer's tiles outlast the default 2 s
  export ENCORE_MEGAKERNEL_WAIT_TIMEOUT_MS=60000
  for area in ${AREAS:-gemv q4k kda mla moe pipeline megakernel sample}; do
    for tool in memcheck racecheck synccheck; do
      [ "$area $tool" = "megakernel racecheck" ] || sanitize "$tool" "$area"
    done
  done
  # racecheck on shared memory handed from one body to the next, the megakernel's way, in a probe
  # with no race (bench/probes/README.md): it reports hazards for `reuse` only. The megakernel's
  # racecheck comes last: its hand-over draws the same report, and it takes the longest.
  if [[ " ${AREAS:-megakernel} " == *" megakernel "* ]]; then
    for mode in alone disjoint reuse; do
      echo "racecheck probe $mode: $(compute-sanitizer --tool racecheck build/bench/encore_racecheck_probe $mode 2>&1 | grep 'RACECHECK SUMMARY')"
    done
    sanitize racecheck megakernel
    races() { grep -E 'Race reported between' "$out/racecheck_megakernel.log"; }
    races | sed -E 's/0x[0-9a-f]+/X/g' | cut -c1-200 | sort | uniq -c | sort -rn | head -4
    # the hand-over's shape: a bulk copy's write (the async proxy) on one side of every report (the
    # reported access, or one it conflicts with: the `and` lines), named, or (inlined into its
    # caller) at a line of bulk_copy_to_shared in async_copy.cuh
    bulk_lines=$(awk '/void bulk_copy_to_shared/{f=1} f{print NR} f&&/^}/{f=0}' ops/common/async_copy.cuh | paste -sd'|')
    bulk="Write access at (encore::device::bulk_copy_to_shared|.* in async_copy\\.cuh:($bulk_lines)( |\$))"
    counts=$(awk -v bulk="$bulk" '/Race reported between/{n++; if (open && !seen) none++; open=1; seen=0; first=($0 ~ bulk)}
      open && $0 ~ bulk {seen=1} open && /Race reported between/ && first {firsts++}
      !/Race reported between/ && !/=========     and/ {if (open && !seen) none++; open=0}
      END{if (open && !seen) none++; printf "%d reports, %d with a bulk copy as the reported access, %d with none on either side", n, firsts, none}' \
      "$out/racecheck_megakernel.log")
    echo "racecheck megakernel: $counts"
  fi
  unset ENCORE_MEGAKERNEL_STEPS ENCORE_MEGAKERNEL_WAIT_TIMEOUT_MS
  # One archive of the logs (a device call returns few files).
  (cd "$out" && tar -cJf sanitizer_logs.tar.xz ./*check_*.log && rm -f ./*check_*.log)
fi

if has bench; then
  build/bench/encore_bench --benchmark_filter="$filter" --benchmark_min_time=0.02 \
    --benchmark_out="$out/bench.json" --benchmark_out_format=json > "$out/bench.log" 2>&1
  echo "bench rc=$?"
  python3 bench/summarize.py "$out/bench.json" > "$out/summary.txt" && head -1 "$out/summary.txt"
fi

if has items; then
  # One item's weight bytes in Kimi-Linear: 64 (matrix, row) units x K / 256 blocks x 144 bytes.
  bytes="moe.shared_gate_up=82944,moe.gate_up=82944,moe.down=36864"
  build/bench/encore_ab --batches 1,4,16 --contexts 4096 --long 0 --rounds 3 --trace --out "$out/ab" > "$out/items_ab.log" 2>&1
  echo "items: encore_ab rc=$? $(grep -c 'same bits' "$out/items_ab.log") points with the same bits"
  for b in 1 4 16; do
    echo "== batch $b"
    python3 bench/ab/item_times.py "$out/ab/trace_b${b}_c4096" --item-bytes "$bytes" > "$out/items_b$b.txt" 2>&1
    sed -n '1,16p' "$out/items_b$b.txt"; sed -n '/^$/,$p' "$out/items_b$b.txt"  # the kinds' items, then their phases
    python3 bench/ab/critical_path.py "$out/ab/trace_b${b}_c4096" > "$out/critical_b$b.txt" 2>&1
  done
  python3 bench/ab/item_times.py "$out/ab/trace_b1_c4096" --layer 10 > "$out/items_b1_layer10.txt" 2>&1
fi
