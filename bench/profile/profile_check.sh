#!/usr/bin/env bash
# Hardware counters (Nsight Compute) for the questions timings leave open, in one device call:
#   1. lm_head at 16 tokens on the int8 and the fp16 tensor-core cores, and at 1 token (dp4a):
#      issue-bound, latency-bound or bandwidth-bound? (bench/notes/2026-12-04-fp16-gemv-core.md)
#   2. the MoE expert kernels at batch 1 (3 blocks per SM in the graph path);
#   3. the megakernel at batch 1, 4K context (one block of 8 warps per SM): is it issue-bound
#      with 8 warps, as bench/notes/2026-12-04-megakernel.md suspects?
# Clocks are left alone (--clock-control none). Usage, from the repository root with build/ built:
#   bash bench/profile/profile_check.sh [OUT_DIR]
# CASES=REGEX profiles only the cases whose name matches (e.g. CASES='b16' for the GEMV cores).
# Writes ncu_<name>.csv (raw metrics, one row per profiled kernel) and prints a summary.
set -uo pipefail
out=${1:-${OUT:-out}}
mkdir -p "$out"
if ! command -v ncu >/dev/null 2>&1; then
  echo "profile_check: ncu is not on the PATH" >&2
  exit 1
fi
here=$(dirname "$0")
sections=(--section SpeedOfLight --section Occupancy --section SchedulerStats --section WarpStateStats
          --section MemoryWorkloadAnalysis --section LaunchStats)

# prof NAME KERNEL_REGEX SKIP COUNT -- COMMAND...
prof() {
  local name=$1 kernel=$2 skip=$3 count=$4
  shift 5
  [[ $name =~ ${CASES:-.} ]] || return 0
  ncu --clock-control none "${sections[@]}" --kernel-name "regex:$kernel" --launch-skip "$skip" --launch-count "$count" \
      --page raw --csv "$@" > "$out/ncu_$name.csv" 2> "$out/ncu_$name.log"
  echo "ncu $name rc=$?"
}

bench=build/bench/encore_bench
once=(--benchmark_min_time=0.001 --benchmark_repetitions=1)
prof lm_head_b16_int8 'gemv_mma_kernel' 2 1 -- $bench --benchmark_filter='^gemv/q4k/kimi_lm_head_163840x2304/b16/' "${once[@]}"
prof lm_head_b16_f16 'gemv_mma_kernel' 2 1 -- $bench --benchmark_filter='^gemv/q4k_f16/kimi_lm_head_163840x2304/b16/' "${once[@]}"
prof lm_head_b1_dp4a 'gemv_kernel' 2 1 -- $bench --benchmark_filter='^gemv/q4k/kimi_lm_head_163840x2304/b1/' "${once[@]}"
prof qkv_b16_f16 'gemv_mma_kernel' 2 1 -- $bench --benchmark_filter='^gemv/q4k_f16/kimi_qkv_4096x2304/b16/' "${once[@]}"
prof moe_experts_b1 'moe_(gate_up|down)_kernel' 4 2 -- $bench --benchmark_filter='^BM_moe_kimi_experts/1/' "${once[@]}"
prof megakernel_b1 'megakernel' 2 1 -- build/bench/encore_ab --batches 1 --contexts 4096 --long 0 --steps 1 --rounds 1 \
    --out "$out/ab_profile"

python3 "$here/ncu_summary.py" "$out"/ncu_*.csv | tee "$out/ncu_summary.txt"
