#!/usr/bin/env bash
# Hardware counters (Nsight Compute) for the questions timings leave open, in one device call:
#   1. lm_head at 16 tokens on the int8 and the fp16 tensor-core cores, and at 1 token (dp4a):
#      issue-bound, latency-bound or bandwidth-bound? (bench/notes/2026-12-04-fp16-gemv-core.md)
#   2. the MoE expert kernels at batch 1 (3 blocks per SM in the graph path) and 64 tokens, and the
#      router's GEMV at 16 and 64 tokens and its top-k at 64 (stalls; per SASS line at 64);
#   3. the megakernel at batch 1, 4K context (one block of 8 warps per SM): is it issue-bound
#      with 8 warps, as bench/notes/2026-12-04-megakernel.md suspects?
#   4. the same megakernel step per body (source counters, SASS): each body's share of the warp
#      samples, its instructions, the code it executes (what an SM fetches again when it runs
#      cold) and its stalls (ncu_source.py; megakernel_b1_source.txt, src_megakernel_b1.csv.xz).
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

# prof_source NAME KERNEL_REGEX SKIP -- COMMAND...: one launch with source counters, exported as
# the SASS source page and summarised per function (ncu_source.py).
prof_source() {
  local name=$1 kernel=$2 skip=$3
  shift 4
  [[ $name =~ ${CASES:-.} ]] || return 0
  ncu --clock-control none --section WarpStateStats --section SourceCounters --kernel-name "regex:$kernel" \
      --launch-skip "$skip" --launch-count 1 -o "$out/$name" -f "$@" > "$out/ncu_$name.log" 2>&1
  echo "ncu $name rc=$?"
  ncu -i "$out/$name.ncu-rep" --page source --csv --print-source sass > "$out/src_$name.csv" 2>> "$out/ncu_$name.log"
  python3 "$here/ncu_source.py" "$out/src_$name.csv" | tee "$out/${name}_source.txt"
  xz -f -T4 "$out/src_$name.csv"
  rm -f "$out/$name.ncu-rep"  # (about 40 MB; the CSV keeps what the summary reads)
}

bench=build/bench/encore_bench
once=(--benchmark_min_time=0.001 --benchmark_repetitions=1)
prof lm_head_b16_int8 'gemv_mma_kernel' 2 1 -- $bench --benchmark_filter='^gemv/q4k_int8/kimi_lm_head_163840x2304/b16/' "${once[@]}"
prof lm_head_b16_f16 'gemv_mma_kernel' 2 1 -- $bench --benchmark_filter='^gemv/q4k/kimi_lm_head_163840x2304/b16/' "${once[@]}"
prof lm_head_b1_dp4a 'gemv_kernel' 2 1 -- $bench --benchmark_filter='^gemv/q4k/kimi_lm_head_163840x2304/b1/' "${once[@]}"
prof qkv_b16_f16 'gemv_mma_kernel' 2 1 -- $bench --benchmark_filter='^gemv/q4k/kimi_qkv_4096x2304/b16/' "${once[@]}"
prof moe_experts_b1 'moe_(gate_up|down)_kernel' 4 2 -- $bench --benchmark_filter='^BM_moe_kimi_experts/1/' "${once[@]}"
# The router's GEMV at 16 and 64 tokens: 96 blocks of 8 warps whose chain grows by a round per
# four tokens (neither staging h nor tiles of token groups made it faster: docs/moe.md §2).
# From two tokens the GEMV runs on tensor cores (docs/moe.md §2); the top-k is the other kernel.
prof moe_router_b16 'router_gemv_kernel' 2 1 -- $bench --benchmark_filter='^BM_moe_kimi_router/16/' "${once[@]}"
prof moe_router_topk_b64 'router_topk_kernel' 2 1 -- $bench --benchmark_filter='^BM_moe_kimi_router/64/' "${once[@]}"
# The experts at 64 tokens, 1.6x their bytes-alone probe (issue 27): prepare, gate/up and down.
prof moe_experts_b64 'moe_(prepare|gate_up|down)_kernel' 6 3 -- $bench --benchmark_filter='^BM_moe_kimi_experts/64/' "${once[@]}"
prof moe_router_b64 'router_gemv_kernel' 2 1 -- $bench --benchmark_filter='^BM_moe_kimi_router/64/' "${once[@]}"
prof_source moe_router_b64_source 'router_gemv_kernel' 2 -- $bench --benchmark_filter='^BM_moe_kimi_router/64/' "${once[@]}"
prof_source moe_gate_up_b64_source 'moe_gate_up_kernel' 2 -- $bench --benchmark_filter='^BM_moe_kimi_experts/64/' "${once[@]}"
# The down kernel at 64 tokens moves its weights at 44% of DRAM peak (2026-12-07): where its warps wait.
prof_source moe_down_b64_source 'moe_down_kernel' 2 -- $bench --benchmark_filter='^BM_moe_kimi_experts/64/' "${once[@]}"
prof megakernel_b1 'megakernel' 2 1 -- build/bench/encore_ab --batches 1 --contexts 4096 --long 0 --steps 1 --rounds 1 \
    --out "$out/ab_profile"

prof_source megakernel_b1_source 'megakernel' 2 -- build/bench/encore_ab --batches 1 --contexts 4096 --long 0 --steps 1 --rounds 1 \
    --out "$out/ab_profile_source"

python3 "$here/ncu_summary.py" "$out"/ncu_*.csv | tee "$out/ncu_summary.txt"
