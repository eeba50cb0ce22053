#!/bin/bash
# One device run: tests, sanitizer on small cases, bench. Logs under $OUT.
cd "$(dirname "$0")/../.."
B=build-mla
CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader > $OUT/gpu.txt 2>&1
timeout ${T_TEST:-150} $B/tests/encore_test_mla > $OUT/gtest.log 2>&1; echo "gtest rc=$?" > $OUT/summary.txt
timeout ${T_BENCH:-60} $B/bench/encore_bench --benchmark_filter=Mla --benchmark_min_time=0.05 > $OUT/bench.log 2>&1; echo "bench rc=$?" >> $OUT/summary.txt
SMALL='MlaGpu.MixedBatchAllHeadCounts:MlaGpu.BadDevice*:MlaGpu.BadHost*:MlaGpu.AppendRope*'
timeout ${T_SAN:-45} $CS --tool memcheck --error-exitcode 1 $B/tests/encore_test_mla --gtest_filter="$SMALL" > $OUT/memcheck.log 2>&1; echo "memcheck rc=$?" >> $OUT/summary.txt
timeout ${T_SAN:-45} $CS --tool racecheck --error-exitcode 1 $B/tests/encore_test_mla --gtest_filter='MlaGpu.AppendRope*:MlaGpu.BadHost*' > $OUT/racecheck.log 2>&1; echo "racecheck rc=$?" >> $OUT/summary.txt
cat $OUT/gpu.txt
grep -E "^\[  (PASSED|FAILED) |FAILED  \]|Failure|\[mla\]" $OUT/gtest.log | head -60
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" $OUT/memcheck.log $OUT/racecheck.log | tail -8
grep -E "device|BM_Mla" $OUT/bench.log | sed 's/ \+/ /g' | cut -c1-230
cat $OUT/summary.txt
