#!/usr/bin/env bash
# Prepared device call (not run yet; bench/notes/2026-12-07-2305-session.md §2). Build HEAD with
# 2026-12-08-moe-slot-width-sweep.patch applied (an env hook for the expert streams' K blocks per
# ring slot, down and gate/up), pack build/ into build_pack/all.tar.xz (no object files), carry
# build_pack, run this: the expert streams' ring probe (bench/probes/README.md); the experts bench over the choices; ncu per kernel for two; the best
# against the default in the step (graph and megakernel); the MoE and pipeline tests under it;
# the down kernel's source counters.
set -u
out=${OUT:-out}; mkdir -p "$out/logs"
L=$out/logs
t0=$(date +%s)
el() { echo "$(( $(date +%s) - t0 ))"; }
fin() { tar -czf $out/logs.tgz -C $out logs; }
rm -rf build; tar -xJf build_pack/all.tar.xz
nvidia-smi --query-gpu=name --format=csv,noheader
export LD_LIBRARY_PATH=$PWD/build/bench
timeout 60 build/bench/encore_expert_ring_probe 7 > $L/expert_ring_probe.log 2>&1; echo "expert ring probe rc=$? $(el) s"; cat $L/expert_ring_probe.log
X="BM_moe_kimi_experts/"
bn() { ENCORE_X_DOWN_SB=$1 ENCORE_X_GU_SB=$2 timeout 30 build/bench/encore_bench --benchmark_filter="$X" --benchmark_min_time=0.05 > $L/x_$1_$2_$3.log 2>&1
  echo "down=$1 gu=$2 ($3) rc=$? $(el) s: $(grep -E '^BM' $L/x_$1_$2_$3.log | awk '{split($1,a,"/"); printf "%s=%s ", a[2], $NF}')"; }
for r in a b; do for c in "4 3" "3 3" "2 3" "1 3" "4 1" "2 2" "2 1" "1 1" "1 2"; do bn $c $r; done; done
fin
pr() { ENCORE_X_DOWN_SB=$1 ENCORE_X_GU_SB=$2 timeout 60 ncu --clock-control none --section SpeedOfLight --kernel-name 'regex:moe_(prepare|gate_up|down)_kernel' --launch-skip 6 --launch-count 3 --page raw --csv \
    --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed build/bench/encore_bench --benchmark_filter='^BM_moe_kimi_experts/64/' --benchmark_min_time=0.001 --benchmark_repetitions=1 > $L/ncu_$1_$2.csv 2> $L/ncu_$1_$2.log
  echo "ncu $1 $2 rc=$? $(el) s"; python3 - $L/ncu_$1_$2.csv <<'PY'
import csv,sys
rows=list(csv.reader(open(sys.argv[1])))
h=[i for i,r in enumerate(rows) if 'Kernel Name' in r]
if h:
  H=rows[h[0]]; k=H.index('Kernel Name'); t=H.index('gpu__time_duration.sum'); d=H.index('dram__throughput.avg.pct_of_peak_sustained_elapsed')
  for r in rows[h[0]+2:]: print('  ', r[k][:40], r[t], 'ns', r[d], '% dram')
PY
}
pr 4 3; pr 1 1
fin
# The best choice at 32 + 64 tokens (mean of the two runs) against the default: the step, and the tests under it.
best=$(for f in $L/x_*_a.log; do c=$(basename $f _a.log); c=${c#x_}; awk -v c=$c '/^BM_moe_kimi_experts\/(32|64)\//{split($NF,v,"="); s+=v[2]} END{print s, c}' $L/x_${c}_a.log $L/x_${c}_b.log; done | sort -n | head -1 | cut -d' ' -f2)
echo "best: $best"; bd=${best%_*}; bg=${best#*_}
ab() { ENCORE_X_DOWN_SB=$2 ENCORE_X_GU_SB=$3 timeout 60 build/bench/encore_ab --batches 1,16,32,64 --contexts 4096 --long 0 --rounds 2 > $L/ab_$1.log 2>&1; echo "ab $1 ($2 $3) rc=$? $(el) s"; grep -E "^\| [0-9]" $L/ab_$1.log | cut -d'|' -f2-5,12; }
ab D1 4 3; ab B1 $bd $bg; ab D2 4 3; ab B2 $bd $bg
fin
ENCORE_X_DOWN_SB=$bd ENCORE_X_GU_SB=$bg timeout 60 build/tests/encore_test_moe > $L/test_moe.log 2>&1
echo "moe tests ($bd $bg) rc=$? $(grep -E '^\[  (PASSED|FAILED)' $L/test_moe.log | head -3) $(el) s"; grep -E "^\[  FAILED" $L/test_moe.log | head -5
ENCORE_X_DOWN_SB=$bd ENCORE_X_GU_SB=$bg timeout 120 build/tests/encore_test_pipeline --gtest_filter='*Megakernel*:*PipelineGpu*:*MoE*:*Moe*' > $L/test_pipeline.log 2>&1
echo "pipeline tests ($bd $bg) rc=$? $(grep -E '^\[  (PASSED|FAILED)' $L/test_pipeline.log | head -3) $(el) s"; grep -E "^\[  FAILED" $L/test_pipeline.log | head -5
fin
mkdir -p $L/prof; CASES='moe_down_b64_source' timeout 150 bash bench/profile/profile_check.sh $L/prof > $L/prof.log 2>&1; echo "prof rc=$? $(el) s"; tail -30 $L/prof.log
fin
echo "end $(el) s"
