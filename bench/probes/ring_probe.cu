// The Q4_K GEMV's weight ring, bytes alone (issue 27: the fp16 core reads lm_head at 16 tokens at
// about 31% of read). Each warp streams its row group (kRows rows of a matrix whose rows are
// K blocks of 144 bytes) over K through a ring of `slots` buffers: one bulk copy per row and slot
// of `copy_blocks` blocks, completing on the slot's mbarrier, as gemv_pipe.cuh does. The consumer
// waits for a slot, touches it, spins `work` cycles (a stand-in for the core's math on those
// blocks) and refills it. Row groups go to warps tile by tile as the mma core's one-part plan
// does. No math: what is left is the copy engine's rate for copies of that size, the ring's depth
// and the consumer's pace. A plain 16-byte-load stream of the same bytes is the roof.
//   encore_ring_probe [repeats]
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include <cuda_runtime.h>

#include "common/async_copy.cuh"
#include "probe_stream.cuh"

namespace {

constexpr int kBlockBytes = 144;  // one Q4_K block: 256 weights
constexpr int kRows = 16;         // rows per warp's group (the mma cores' kMmaTileRows)
constexpr int kCopies = 4;        // matrix copies rotated through, so no launch finds its bytes in L2

struct RingConfig {
  int k_blocks;     // blocks per row
  int copy_blocks;  // blocks per row and slot (one bulk copy each)
  int slots;        // ring depth per warp
  int warps;        // per block, one block per SM
  int work;         // consumer cycles per slot
};

struct RingArgs {
  const char* mat;
  std::int64_t rows;
  RingConfig c;
  unsigned* sink;
};

__global__ void ring_kernel(const RingArgs a) {
  extern __shared__ __align__(1024) char smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const RingConfig& c = a.c;
  const int slot_bytes = kRows * c.copy_blocks * kBlockBytes;
  const int pieces = (c.k_blocks + c.copy_blocks - 1) / c.copy_blocks;
  const std::int64_t row_bytes = std::int64_t(c.k_blocks) * kBlockBytes;
  std::uint64_t* bars = reinterpret_cast<std::uint64_t*>(smem) + warp * c.slots;
  char* ring = smem + 1024 + std::size_t(warp) * c.slots * slot_bytes;
  const std::int64_t groups = a.rows / kRows, tiles = groups / c.warps;
  // The warp's (group, piece) sequence: tiles blockIdx.x, + gridDim.x, ..., every piece of each.
  const std::int64_t steps = ((tiles - blockIdx.x + gridDim.x - 1) / gridDim.x) * pieces;
  auto fill = [&](std::int64_t step) {
    if (step >= steps) return;
    const int slot = int(step % c.slots), piece = int(step % pieces);
    const std::int64_t tile = blockIdx.x + (step / pieces) * gridDim.x;
    const std::int64_t row0 = (tile * c.warps + warp) * kRows;
    const int nb = min(c.copy_blocks, c.k_blocks - piece * c.copy_blocks);
    const std::uint32_t bytes = std::uint32_t(nb) * kBlockBytes;
    if (lane == 0) encore::device::barrier_arrive_expect(&bars[slot], kRows * bytes);
    __syncwarp();
    if (lane < kRows)
      encore::device::bulk_copy_to_shared(ring + slot * slot_bytes + lane * c.copy_blocks * kBlockBytes,
                                          a.mat + (row0 + lane) * row_bytes + std::int64_t(piece) * c.copy_blocks * kBlockBytes,
                                          bytes, &bars[slot]);
  };
  probe::consume_ring(bars, ring, slot_bytes, c.slots, steps, c.work, fill, a.sink);
}

}  // namespace

int main(int argc, char** argv) {
  const int repeats = argc > 1 ? std::atoi(argv[1]) : 9;
  const cudaDeviceProp prop = probe::device_properties();
  const int sms = prop.multiProcessorCount;
  // lm_head's shape: 163840 rows of K = 2304 (9 blocks, 1296 bytes a row), 212 MB.
  const std::int64_t rows = 163840;
  const int k_blocks = 9;
  const std::size_t bytes = std::size_t(rows) * k_blocks * kBlockBytes;
  char* mats = nullptr;
  unsigned* sink = nullptr;
  PROBE_CHECK(cudaMalloc(&mats, bytes * kCopies));
  PROBE_CHECK(cudaMalloc(&sink, 64));
  PROBE_CHECK(cudaMemset(mats, 1, bytes * kCopies));
  auto time_it = [&](auto&& launch) {  // each run on the next copy
    return probe::median_launch_us(repeats, [&](int r) { launch(mats + (r % kCopies) * bytes); });
  };
  const float roof_us = time_it([&](const char* m) {
    probe::stream_kernel<<<sms * 4, 512>>>(reinterpret_cast<const uint4*>(m), std::int64_t(bytes / 16), sink);
  });
  std::printf("%s, %d SMs; %zu MB (lm_head 163840 x 2304), rotated over %d copies; medians of %d\n", prop.name, sms, bytes >> 20,
              kCopies, repeats);
  std::printf("roof (16-byte loads): %.1f us, %.0f GB/s\n\n", roof_us, bytes / roof_us * 1e-3);
  std::printf("%-12s %5s %5s %5s %9s %9s %9s %7s\n", "copy bytes", "slots", "warps", "work", "KB/SM", "us", "GB/s", "% roof");
  const RingConfig configs[] = {
      {9, 1, 2, 8, 0},   {9, 1, 4, 8, 0},   {9, 1, 8, 8, 0},   {9, 2, 2, 8, 0},   {9, 2, 3, 8, 0},   {9, 2, 4, 8, 0},
      {9, 3, 3, 8, 0},   {9, 9, 2, 4, 0},   {9, 9, 2, 2, 0},   {9, 1, 4, 8, 300}, {9, 1, 4, 8, 600}, {9, 1, 8, 8, 600},
      {9, 2, 3, 8, 600}, {9, 2, 3, 8, 1200}, {9, 3, 3, 8, 900}, {9, 9, 2, 4, 2700}, {9, 1, 4, 16, 600}, {9, 2, 3, 16, 1200},
  };
  for (const RingConfig& c : configs) {
    const std::size_t smem = 1024 + std::size_t(c.warps) * c.slots * kRows * c.copy_blocks * kBlockBytes;
    if (smem > prop.sharedMemPerBlockOptin) continue;
    PROBE_CHECK(cudaFuncSetAttribute(ring_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    const float us = time_it([&](const char* m) { ring_kernel<<<sms, c.warps * 32, smem>>>(RingArgs{m, rows, c, sink}); });
    std::printf("%-12d %5d %5d %5d %9.1f %9.1f %9.0f %7.1f\n", c.copy_blocks * kBlockBytes, c.slots, c.warps, c.work,
                (smem - 1024) / 1024.0, us, bytes / us * 1e-3, 100.0 * roof_us / us);
  }
  return 0;
}
