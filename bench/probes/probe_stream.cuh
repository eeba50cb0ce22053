// What the weight-ring probes share: the ring's consumer (a spin as the stand-in for math), the read
// roof (every byte once with 16-byte loads), and a launch's median time over rotated copies.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include <cuda_runtime.h>

#include "common/async_copy.cuh"
#include "probe_check.h"

namespace probe {

__device__ __forceinline__ void spin(int cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}

// Warp-wide: a warp's ring of `slots` buffers of `slot_bytes` at `ring`, one mbarrier each at
// `bars`. Inits the barriers and issues the first `slots` pieces (fill(step) issues piece `step`
// into buffer step % slots, nothing past the last), then per piece: waits for its buffer, touches
// it, spins `work` cycles and refills the buffer with the piece `slots` later.
template <class Fill>
__device__ void consume_ring(std::uint64_t* bars, const char* ring, int slot_bytes, int slots, std::int64_t steps, int work,
                             Fill&& fill, unsigned* sink) {
  const int lane = threadIdx.x % 32;
  if (lane == 0) {
    for (int i = 0; i < slots; ++i) encore::device::barrier_init(&bars[i], 1);
    encore::device::fence_barrier_init();
  }
  __syncwarp();
  for (int i = 0; i < slots; ++i) fill(i);
  unsigned acc = 0;
  for (std::int64_t step = 0; step < steps; ++step) {
    const int slot = int(step % slots);
    encore::device::barrier_wait(&bars[slot], unsigned(step / slots) & 1u);
    acc += reinterpret_cast<const unsigned*>(ring + slot * slot_bytes)[lane];
    if (work > 0) spin(work);
    __syncwarp();
    fill(step + slots);
  }
  if (acc == 0x12345678u) sink[0] = acc;  // keeps the loads
}

__global__ void stream_kernel(const uint4* p, std::int64_t n, unsigned* sink) {
  unsigned acc = 0;
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x) {
    const uint4 v = p[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) sink[0] = acc;  // keeps the loads
}

// Device 0's properties (its SM count: multiProcessorCount).
inline cudaDeviceProp device_properties() {
  cudaDeviceProp prop{};
  PROBE_CHECK(cudaGetDeviceProperties(&prop, 0));
  return prop;
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
