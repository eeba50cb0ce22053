// The MoE expert streams' weight rings, bytes alone (docs/moe.md §5; issue 27: at 64 tokens the
// down kernel moves its weights at 44% of DRAM peak, gate/up at 69%). The same copies as
// moe_expert_stream.cuh issues: 8 warps a block, each warp's piece of an item one TMA box per
// matrix (box_rows rows x the slot's K blocks, through a tensor map of rows of 4-byte words) into
// a ring of `slots` buffers, completing on one mbarrier per buffer. The consumer waits for a
// buffer, touches it, spins `work` cycles (a stand-in for the math on those blocks) and refills
// it. Items (64 units: 64 rows, or 32 rows of two matrices) go to blocks first, first + grid, ...
// No math and no activations: what is left is the ring's depth, the copies' size and shape, and
// the consumer's pace. A box whose pitch is padded by 16 bytes (`slot_pitch`, against bank
// conflicts) reads past the end of a row whose K blocks it covers in full: the copy engine fills
// those words with zeros. A plain 16-byte-load stream of the same bytes is the roof.
//   encore_expert_ring_probe [repeats]
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <cuda_runtime.h>

#include "common/async_copy.cuh"
#include "common/tensor_map.h"
#include "probe_stream.cuh"
#include "q4k/q4k_stream.cuh"

namespace {

using encore::q4k::kBlockBytes;
constexpr int kWarps = 8;
constexpr int kUnits = 64;       // (matrix, row) units per item: 8 per warp
constexpr int kMaxSlots = 8;
constexpr int kExperts = 222;     // experts one step touches at 64 tokens (the notes' count)
constexpr int kCopies = 2;        // weight copies rotated through, so no launch finds its bytes in L2

struct Stream {
  const char* name;
  int k_blocks;  // K blocks of a row
  int matrices;  // 1 (down) or 2 (gate and up)
  int rows;      // rows of one expert's matrix
};
constexpr Stream kDown{"down", 4, 1, 2304}, kGateUp{"gate/up", 9, 2, 1024};

struct RingConfig {
  int width;          // K blocks per slot
  bool pad;           // pitch padded by 16 bytes where the blocks' 16-byte units are even (slot_pitch)
  int slots;          // ring buffers per warp
  int blocks_per_sm;
  int work;           // consumer cycles per piece
};

// The streams' padded pitch (q4k::slot_pitch), or the bare row of `width` blocks.
__host__ __device__ int pitch_bytes(int width, bool pad) { return pad ? encore::q4k::slot_pitch(width) : width * kBlockBytes; }
// One warp's buffer: a box per matrix, each 128-byte aligned (the TMA engine's rule).
__host__ __device__ int slot_bytes_of(const Stream& s, int box_rows, int pitch) {
  return s.matrices * ((box_rows * pitch + 127) / 128 * 128);
}

struct RingArgs {
  CUtensorMap map[2];
  Stream s;
  RingConfig c;
  int items;
  unsigned* sink;
};

__global__ void __launch_bounds__(kWarps * 32) ring_kernel(const __grid_constant__ RingArgs a) {
  extern __shared__ __align__(1024) char smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const Stream& s = a.s;
  const RingConfig& c = a.c;
  const int pitch = pitch_bytes(c.width, c.pad), box_rows = kUnits / kWarps / s.matrices;
  const int slot_bytes = slot_bytes_of(s, box_rows, pitch), box_stride = slot_bytes / s.matrices;
  const int pieces = (s.k_blocks + c.width - 1) / c.width;
  std::uint64_t* bars = reinterpret_cast<std::uint64_t*>(smem) + warp * kMaxSlots;
  char* ring = smem + 1024 + std::size_t(warp) * c.slots * slot_bytes;
  const int my_items = a.items > int(blockIdx.x) ? (a.items - int(blockIdx.x) + gridDim.x - 1) / gridDim.x : 0;
  const std::int64_t steps = std::int64_t(my_items) * pieces;
  auto fill = [&](std::int64_t step) {
    if (step >= steps || lane != 0) return;
    const int slot = int(step % c.slots), piece = int(step % pieces);
    const int item = int(blockIdx.x + (step / pieces) * gridDim.x);
    const int row = item * (kUnits / s.matrices) + warp * box_rows;
    encore::device::barrier_arrive_expect(&bars[slot], std::uint32_t(s.matrices * box_rows * pitch));
    for (int m = 0; m < s.matrices; ++m)
      encore::device::tma_load_2d(ring + slot * slot_bytes + m * box_stride, &a.map[m], piece * c.width * (kBlockBytes / 4), row,
                                  &bars[slot]);
  };
  probe::consume_ring(bars, ring, slot_bytes, c.slots, steps, c.work, fill, a.sink);
}

// Rows of `row_bytes` as 4-byte words, boxes of box_words x box_rows (zeros past a row's end): the
// streams' own encoder (moe.cu's maps).
CUtensorMap encode_map(const void* base, std::int64_t rows, int row_bytes, int box_words, int box_rows) {
  CUtensorMap map;
  const encore::Status st = encore::detail::encode_tensor_map_2d_words(&map, base, std::uint64_t(row_bytes / 4), std::uint64_t(rows),
                                                                       std::uint64_t(row_bytes), std::uint32_t(box_words),
                                                                       std::uint32_t(box_rows), "expert ring probe");
  if (!st.ok()) {
    std::fprintf(stderr, "%s\n", st.to_string().c_str());
    std::exit(1);
  }
  return map;
}

}  // namespace

int main(int argc, char** argv) {
  const int repeats = argc > 1 ? std::atoi(argv[1]) : 9;
  const cudaDeviceProp prop = probe::device_properties();
  const int sms = prop.multiProcessorCount;
  unsigned* sink = nullptr;
  PROBE_CHECK(cudaMalloc(&sink, 64));
  auto time_it = [&](auto&& launch) {  // each run on the next copy
    return probe::median_launch_us(repeats, [&](int r) { launch(r % kCopies); });
  };
  std::printf("%s, %d SMs; %d experts' matrices rotated over %d copies; medians of %d\n", prop.name, sms, kExperts, kCopies, repeats);
  // What the plan runs today (2 slots, 2 blocks per SM: down 4 blocks padded, gate/up 3), then
  // narrower slots, deeper rings, an unpadded full-row box, down at 3 blocks per SM (2 slots of 2
  // blocks: what fits beside the activations there), and consumers as slow as the math.
  const std::vector<std::pair<Stream, RingConfig>> configs = {
      {kDown, {4, true, 2, 2, 0}},     {kDown, {4, false, 2, 2, 0}},    {kDown, {2, true, 4, 2, 0}},
      {kDown, {2, false, 4, 2, 0}},    {kDown, {1, true, 8, 2, 0}},     {kDown, {4, true, 2, 2, 2000}},
      {kDown, {4, false, 2, 2, 2000}}, {kDown, {2, true, 4, 2, 1000}},  {kDown, {1, true, 8, 2, 500}},
      {kDown, {4, true, 3, 1, 0}},     {kDown, {4, false, 5, 1, 0}},    {kDown, {2, true, 2, 3, 0}},
      {kDown, {2, true, 2, 3, 1000}},  {kGateUp, {3, true, 2, 2, 0}},
      {kGateUp, {1, true, 5, 2, 0}},   {kGateUp, {3, true, 2, 2, 1500}}, {kGateUp, {1, true, 5, 2, 500}},
  };
  for (const Stream& s : {kDown, kGateUp}) {
    const std::int64_t rows = std::int64_t(kExperts) * s.rows;
    const int row_bytes = s.k_blocks * kBlockBytes;
    const std::size_t matrix_bytes = std::size_t(rows) * row_bytes, bytes = matrix_bytes * s.matrices;
    char* mats = nullptr;
    PROBE_CHECK(cudaMalloc(&mats, bytes * kCopies));
    PROBE_CHECK(cudaMemset(mats, 1, bytes * kCopies));
    const float roof_us = time_it([&](int copy) {
      probe::stream_kernel<<<sms * 4, 512>>>(reinterpret_cast<const uint4*>(mats + copy * bytes), std::int64_t(bytes / 16), sink);
    });
    std::printf("\n%s: %lld rows of %d K blocks x %d matrices, %.1f MB; roof (16-byte loads) %.1f us, %.0f GB/s\n", s.name,
                static_cast<long long>(rows), s.k_blocks, s.matrices, bytes / 1e6, roof_us, bytes / roof_us * 1e-3);
    std::printf("%6s %4s %5s %7s %6s %9s %9s %9s %7s\n", "width", "pad", "slots", "per SM", "work", "ring KB", "us", "GB/s", "% roof");
    for (const auto& [stream, c] : configs) {
      if (stream.k_blocks != s.k_blocks) continue;
      const int pitch = pitch_bytes(c.width, c.pad), box_rows = kUnits / kWarps / s.matrices;
      const int slot_bytes = slot_bytes_of(s, box_rows, pitch);
      const std::size_t smem = 1024 + std::size_t(kWarps) * c.slots * slot_bytes;
      if (smem * c.blocks_per_sm > std::size_t(prop.sharedMemPerMultiprocessor) || smem > prop.sharedMemPerBlockOptin) continue;
      PROBE_CHECK(cudaFuncSetAttribute(ring_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
      RingArgs args[kCopies];
      for (int copy = 0; copy < kCopies; ++copy) {
        args[copy] = RingArgs{{}, s, c, int(rows * s.matrices / kUnits), sink};
        for (int m = 0; m < s.matrices; ++m)
          args[copy].map[m] = encode_map(mats + copy * bytes + m * matrix_bytes, rows, row_bytes, pitch / 4, box_rows);
      }
      const float us = time_it([&](int copy) { ring_kernel<<<sms * c.blocks_per_sm, kWarps * 32, smem>>>(args[copy]); });
      std::printf("%6d %4s %5d %7d %6d %9.1f %9.1f %9.0f %7.1f\n", c.width, c.pad && c.width % 2 == 0 ? "yes" : "no", c.slots,
                  c.blocks_per_sm, c.work, (smem - 1024) / 1024.0, us, bytes / us * 1e-3, 100.0 * roof_us / us);
    }
    PROBE_CHECK(cudaFree(mats));
  }
  return 0;
}
