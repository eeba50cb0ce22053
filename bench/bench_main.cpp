// encore_bench: the op benchmarks (and, once the decode pipeline exists, the decode benchmark).
// --help and --benchmark_list_tests work anywhere; running benchmarks refuses plainly, with a
// non-zero exit, when no CUDA device is present.
#include <cstdio>
#include <string>

#include <benchmark/benchmark.h>

#include <encore/device.h>

#include "bench_util.h"

namespace {
// --benchmark_list_tests (bare, =true or =1): names only, no device needed.
bool lists_tests(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--benchmark_list_tests" || a == "--benchmark_list_tests=true" || a == "--benchmark_list_tests=1") return true;
  }
  return false;
}
}  // namespace

int main(int argc, char** argv) {
  const bool list_only = lists_tests(argc, argv);
  benchmark::Initialize(&argc, argv);  // prints --help and exits
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  if (list_only) {
    benchmark::RunSpecifiedBenchmarks();
    return 0;
  }
  std::string why;
  if (!encore::cuda_device_available(&why)) {
    std::fprintf(stderr, "encore_bench: %s; the benchmarks need an NVIDIA GPU (built for sm_90a, H100/H200).\n", why.c_str());
    return 1;
  }
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
