// encore_bench: the op benchmarks (and, once the decode pipeline exists, the decode benchmark).
// Refuses plainly, with a non-zero exit, when no CUDA device is present.
#include <cstdio>
#include <string>

#include <benchmark/benchmark.h>

#include <encore/device.h>

#include "bench_util.h"

int main(int argc, char** argv) {
  std::string why;
  if (!encore::cuda_device_available(&why)) {
    std::fprintf(stderr, "encore_bench: %s; the benchmarks need an NVIDIA GPU (built for sm_90a, H100/H200).\n", why.c_str());
    return 1;
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  const auto& f = encore::bench::device_facts();
  benchmark::AddCustomContext("device", f.name);
  benchmark::AddCustomContext("sms", std::to_string(f.sms));
  benchmark::AddCustomContext("l2_MB", std::to_string(f.l2_bytes >> 20));
  benchmark::AddCustomContext("measured_read_GBps", std::to_string(f.read_bw_bytes_per_s * 1e-9));
  benchmark::AddCustomContext("measured_copy_GBps", std::to_string(f.copy_bw_bytes_per_s * 1e-9));
  std::fprintf(stderr, "device %s: %d SMs, L2 %zu MB, measured read %.0f GB/s, copy %.0f GB/s\n", f.name.c_str(), f.sms,
               f.l2_bytes >> 20, f.read_bw_bytes_per_s * 1e-9, f.copy_bw_bytes_per_s * 1e-9);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
