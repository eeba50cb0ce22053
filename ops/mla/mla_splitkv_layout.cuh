// Split-KV attention (docs/mla.md §8): the tile's configuration, kernel parameters and shared-memory
// plan, the query copy (16-byte cp.async into the 128-byte swizzled layout of common/wgmma.cuh)
// and which pages of a request a part computes. The pages themselves move through
// mla_page_ring.cuh. Used by the split-KV body (mla_splitkv_tile.cuh) and the fused combine
// (mla_fused_combine.cuh).
#pragma once

#include <cstdint>

#include <cuda.h>

#include <encore/ops/mla.h>

#include "common/block.h"
#include "common/smem_allocator.cuh"
#include "common/wgmma.cuh"
#include "mla/mla_device.cuh"
#include "mla/mla_plan.h"

namespace encore::mla {

// A tile's shape: kHeads query heads (the wgmma N) and a ring of kSlots page slots, for blocks that
// run kBlocksPerSm to an SM. The page layout and the per-element math are the same in every shape.
template <int kHeads, int kSlots, int kResidentPerSm>
struct SplitKvShape {
  static constexpr int kRows = kHeads;  // query heads per tile (the wgmma N)
  static constexpr int kRingSlots = kSlots;
  static constexpr int kBlocksPerSm = kResidentPerSm;
  static constexpr int kAccPerThread = kRows / 2;  // fp32 accumulators of one m64 x N wgmma per thread
  static constexpr int kRowThreads = 8 * kRows;    // threads that copy Q and run the softmax: 8 per head row
  static constexpr int kWarpgroups = kWarpsPerBlock / 4;
  static constexpr int kBlockCols = 64;                                  // values per 128-byte swizzle row
  static constexpr int kColBlocks = kMlaRowDim / kBlockCols;             // 9
  static constexpr int kColBlockBytes = kMlaPageTokens * 128;            // one column block of a page
  static constexpr int kPageBytes = kColBlocks * kColBlockBytes;
  static constexpr int kQColBlockBytes = kRows * 128;                    // one column block of Q
  static constexpr int kKStepsPerGroup = kMlaRowDim / 16 / kWarpgroups;  // score k16 steps (18)
  static constexpr int kOutBlocksPerGroup = kMlaLatentDim / kBlockCols / kWarpgroups;  // P V m64 blocks (4)
  static constexpr int kPartialStride = kMlaPageTokens + 4;  // fp32; conflict-free fragment stores
  static constexpr int kOutStride = kMlaLatentDim + 4;       // fp32 staging of O; conflict-free stores
  static_assert(kWarpgroups == 2 && kKStepsPerGroup * 16 * 2 == kMlaRowDim);
  static_assert(kRows % 8 == 0 && kRowThreads <= kBlockThreads && kRingSlots >= 1 && kRingSlots <= 4);
  static_assert(kRows * kOutStride * 4 <= kPageBytes, "O is staged in a page stage");
};
// The op's shape: one block per SM (about 207 KB of shared memory), two pages in flight.
using SplitKvConfig = SplitKvShape<32, 2, 1>;
// Half an SM's shared memory (the megakernel at two blocks per SM): 16 heads, one page slot; the
// other block on the SM loads while this one computes. The same bits per (request, head) as the
// op's shape: each output element runs the same k steps in the same order.
using SplitKvHalfSm = SplitKvShape<16, 1, 2>;

// The split-KV kernel's parameters: the op's, and the page pool as a TMA tensor map
// ([num_pages * 64 tokens][576] bf16, boxes of 64 tokens x 64 values), encoded per launch.
struct SplitKvArgs {
  MlaAttentionParams p;
  CUtensorMap pages;
};
Status splitkv_args(const MlaAttentionParams& p, SplitKvArgs* args);  // (mla_splitkv.cu)
// mla_splitkv in the shape for half an SM (SplitKvHalfSm, below): the same outputs, bit for bit, as
// the op's; for the tests of the shape the megakernel runs at two blocks per SM. (mla_splitkv.cu)
Status mla_splitkv_half_sm(const MlaAttentionParams& p, cudaStream_t stream);
// The page pool's tensor map alone (for callers that keep it elsewhere: the megakernel's table).
Status encode_pages_map(const MlaPagedCache& cache, CUtensorMap* map);

// How the tile moves pages and which phases it runs. kOp is the op; the others exist for the
// benchmark's account of the time (loads without the math; the math without loads after the
// first slots, on stale data).
enum class SplitKvVariant { kOp, kLoadsOnly, kComputeOnly };

template <class Cfg = SplitKvConfig>
struct SplitKvSmem {
  char* page;             // [kRingSlots][kColBlocks][64 tokens x 128 B], swizzled
  char* q;                // [kColBlocks][kRows heads x 128 B], swizzled
  char* probs;            // [kRows heads x 128 B]: P as bf16, swizzled
  float* partial;         // [kWarpgroups][kRows][kPartialStride]: scores of each k half
  float* row_max;         // [kRows] running max, log2 domain
  float* row_sum;         // [kRows] running sum of p (fp32)
  float* row_alpha;       // [kRows] rescale factor of the current page
  std::uint64_t* page_full;  // [kRingSlots] mbarriers: one phase per page copied into the slot

  // The swizzled tiles need 1024-byte aligned addresses: the device aligns the base at run time,
  // the host (sizing only) counts the worst-case pad.
  __host__ __device__ explicit SplitKvSmem(char* base) {
#ifdef __CUDA_ARCH__
    const std::size_t pad = (encore::device::kSwizzleAtomBytes - encore::device::smem_address(base) % encore::device::kSwizzleAtomBytes) %
                            encore::device::kSwizzleAtomBytes;
#else
    const std::size_t pad = encore::device::kSwizzleAtomBytes;
#endif
    encore::device::SmemAllocator a(base + pad);
    page = a.take<char>(std::size_t(Cfg::kRingSlots) * Cfg::kPageBytes, encore::device::kSwizzleAtomBytes);
    q = a.take<char>(std::size_t(Cfg::kColBlocks) * Cfg::kQColBlockBytes, encore::device::kSwizzleAtomBytes);
    probs = a.take<char>(Cfg::kRows * 128, encore::device::kSwizzleAtomBytes);
    partial = a.take<float>(Cfg::kWarpgroups * Cfg::kRows * Cfg::kPartialStride);
    row_max = a.take<float>(Cfg::kRows);
    row_sum = a.take<float>(Cfg::kRows);
    row_alpha = a.take<float>(Cfg::kRows);
    page_full = a.take<std::uint64_t>(Cfg::kRingSlots, 8);
    bytes = pad + a.used();
  }
  std::size_t bytes;
};

template <class Cfg = SplitKvConfig>
std::size_t mla_splitkv_smem_bytes() { return SplitKvSmem<Cfg>(nullptr).bytes; }

template <class Cfg = SplitKvConfig>
__host__ __device__ inline int head_groups(int num_heads) { return (num_heads + Cfg::kRows - 1) / Cfg::kRows; }

// Query copy placement: thread t < kRowThreads moves 16-byte chunk t % 8 of head row t / 8 of
// every column block.
__device__ __forceinline__ int copy_row() { return threadIdx.x / 8; }
__device__ __forceinline__ int copy_smem_offset() { return encore::device::swizzled_offset(copy_row(), threadIdx.x % 8); }

// The tile's kRows query rows of request `req` -> q (swizzled); heads beyond num_heads are zero.
template <class Cfg>
__device__ __forceinline__ void load_q(const MlaAttentionParams& p, int req, int group, char* q) {
  if constexpr (Cfg::kRowThreads < kBlockThreads)
    if (int(threadIdx.x) >= Cfg::kRowThreads) return;
  const int head = group * Cfg::kRows + copy_row();
  const bool valid = head < p.num_heads;
  const __nv_bfloat16* src = p.q576 + (std::int64_t(req) * p.num_heads + (valid ? head : 0)) * kMlaRowDim + (threadIdx.x % 8) * 8;
  char* dst = q + copy_smem_offset();
#pragma unroll
  for (int b = 0; b < Cfg::kColBlocks; ++b) device::cp_async_16(dst + b * Cfg::kQColBlockBytes, src + b * Cfg::kBlockCols, valid ? 16 : 0);
}

// Page id of (request, page); read one iteration ahead so its latency hides behind compute.
__device__ __forceinline__ std::int32_t page_id_of(const MlaAttentionParams& p, int req, int page_idx) {
  return p.cache.block_table[std::int64_t(req) * p.cache.block_table_stride + page_idx];
}

// The pages of request `req` that a part computes: page_begin .. page_begin + num_pages - 1 of the
// request (tokens below token_end), and the ids of the first kRingSlots of them, read speculatively
// with the length (one round trip; clamped into the table row, used only for pages that exist).
template <class Cfg>
struct RequestPages {
  int len, page_begin, token_end, num_pages;
  std::int32_t first_ids[Cfg::kRingSlots];
  __device__ int valid_tokens(int j) const { return min(token_end - (page_begin + j) * kMlaPageTokens, kMlaPageTokens); }
  // Page j holds the request's newest row: the one mla_kv_append writes in this step (the
  // scheduler flags any position but len - 1).
  __device__ bool newest(int j) const { return page_begin + j == (len - 1) / kMlaPageTokens; }
};
template <class Cfg>
__device__ inline RequestPages<Cfg> request_pages(const MlaAttentionParams& p, const MlaPartPlan& plan, int req) {
  RequestPages<Cfg> r;
  r.page_begin = req == plan.begin_req ? plan.begin_page : 0;
#pragma unroll
  for (int s = 0; s < Cfg::kRingSlots; ++s) r.first_ids[s] = page_id_of(p, req, min(r.page_begin + s, p.cache.max_pages_per_seq - 1));
  r.len = p.seq_lens[req];
  const int page_end_plan = req == plan.end_req ? plan.end_page : plan_pages(r.len, 1 << 30);
  // Pages that hold at least one token (a zero-length request has none).
  r.token_end = min(r.len, page_end_plan * kMlaPageTokens);
  r.num_pages = max((r.token_end + kMlaPageTokens - 1) / kMlaPageTokens - r.page_begin, 0);
  return r;
}


}  // namespace encore::mla
