#!/usr/bin/env bash
# Prepared device call (bench/notes/2026-12-08-0113-session.md §2): the down stream's latency
# variants. Binaries in build_var/vars.tar.xz (2026-12-08-moe-down-variants-build.sh), built from HEAD + 2026-12-08-moe-down-variants.patch
# with ENCORE_X_DOT / ENCORE_X_DOWN3 defined at the top of ops/moe/moe.cu only (the megakernel
# keeps HEAD's dot, so encore_ab's bits column compares each variant's kernels with HEAD's math):
#   v0 HEAD; v1 K-block loop unrolled 2; v2 unrolled 4; v3 next block's bytes loaded a block ahead;
#   v4 v3 + the next entry's activations loaded an entry ahead; v5 down at 3 blocks per SM, width 2;
#   v6 v3 + v5; v7 each dp4a sum in two chains of four (integer: same sums); v8 v7 + v5;
#   v9 v7 with the K-block loop unrolled 2 (the general plan's kernels and one token's; v7 elsewhere).
#   (Dot variants apply to the general plan's kernels only; v7-v9 to every expert kernel.)
# First the expert ring probe (with v5's ring: width 2, 2 slots, 3 blocks per SM).
set -u
# The logs stay outside $OUT (a call brings back at most 8 files): one archive comes back.
out=${OUT:-out}; L=/tmp/variant_logs; mkdir -p "$out" "$L"
t0=$(date +%s); el() { echo "$(( $(date +%s) - t0 ))"; }
fin() { tar -czf $out/logs.tgz -C /tmp variant_logs; }
cd build_var && tar -xJf vars.tar.xz && cd ..
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
export LD_LIBRARY_PATH=$PWD/build_var
V=${VARIANTS:-"0 1 2 3 4 5 6 7 8 9"}
timeout 60 build_var/encore_expert_ring_probe 7 > $L/expert_ring_probe.log 2>&1; echo "ring probe rc=$? $(el) s"; cat $L/expert_ring_probe.log
for r in a b c; do for v in $V; do
  timeout 30 build_var/encore_bench_v$v --benchmark_filter='BM_moe_kimi_experts/' --benchmark_min_time=0.05 > $L/x_v${v}_$r.log 2>&1
  echo "v$v ($r) rc=$? $(el) s: $(grep -E '^BM' $L/x_v${v}_$r.log | awk '{split($1,a,"/"); printf "%s=%s ", a[2], $NF}')"
done; done
fin
for v in $V; do
  timeout 60 ncu --clock-control none --kernel-name 'regex:moe_(gate_up|down)_kernel' --launch-skip 6 --launch-count 4 --page raw --csv \
    --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,smsp__inst_executed.sum build_var/encore_bench_v$v --benchmark_filter='^BM_moe_kimi_experts/64/' --benchmark_min_time=0.001 --benchmark_repetitions=1 > $L/ncu_v$v.csv 2> $L/ncu_v$v.log
  echo "ncu v$v rc=$? $(el) s"; python3 - $L/ncu_v$v.csv <<'PY'
import csv,sys
rows=list(csv.reader(open(sys.argv[1])))
h=[i for i,r in enumerate(rows) if 'Kernel Name' in r]
if h:
  H=rows[h[0]]; k=H.index('Kernel Name'); t=H.index('gpu__time_duration.sum'); d=H.index('dram__throughput.avg.pct_of_peak_sustained_elapsed'); n=H.index('smsp__inst_executed.sum')
  for r in rows[h[0]+2:]: print('  ', r[k][:32], r[t], 'ns', r[d], '% dram', r[n], 'inst')
PY
done
fin
for v in $V; do
  timeout 60 build_var/encore_ab_v$v --batches 1,16,64 --contexts 4096 --long 0 --rounds 1 > $L/ab_v$v.log 2>&1
  echo "ab v$v rc=$? $(el) s"; grep -E "^\| [0-9]" $L/ab_v$v.log | cut -d'|' -f2-5,12
done
fin
for v in $V; do
  timeout 90 build_var/encore_test_moe_v$v > $L/test_moe_v$v.log 2>&1
  echo "moe tests v$v rc=$? $(grep -E '^\[  (PASSED|FAILED)' $L/test_moe_v$v.log | head -2 | tr '\n' ' ') $(el) s"; grep -E "^\[  FAILED" $L/test_moe_v$v.log | head -3
done
fin
echo "end $(el) s"
