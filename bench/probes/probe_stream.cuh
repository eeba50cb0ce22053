// What the weight-ring probes share: a consumer's stand-in for math, the read roof (every byte
// once with 16-byte loads), and a launch's median time over rotated copies.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include <cuda_runtime.h>

#include "probe_check.h"

namespace probe {

__device__ __forceinline__ void spin(int cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}

__global__ void stream_kernel(const uint4* p, std::int64_t n, unsigned* sink) {
  unsigned acc = 0;
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x) {
    const uint4 v = p[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) sink[0] = acc;  // keeps the loads
}

// Median of `repeats` timed launches in us, after one untimed; launch(r) gets the run's index
// (for rotating copies larger than L2).
template <class Launch>
float median_launch_us(int repeats, Launch&& launch) {
  cudaEvent_t e0, e1;
  PROBE_CHECK(cudaEventCreate(&e0));
  PROBE_CHECK(cudaEventCreate(&e1));
  std::vector<float> us;
  for (int r = 0; r < repeats + 1; ++r) {
    PROBE_CHECK(cudaEventRecord(e0));
    launch(r);
    PROBE_CHECK(cudaGetLastError());
    PROBE_CHECK(cudaEventRecord(e1));
    PROBE_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    PROBE_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    if (r > 0) us.push_back(ms * 1e3f);
  }
  PROBE_CHECK(cudaEventDestroy(e0));
  PROBE_CHECK(cudaEventDestroy(e1));
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

}  // namespace probe
