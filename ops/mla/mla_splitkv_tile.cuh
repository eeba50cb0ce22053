// Split-KV attention body (spec §8): one tile = (scheduler part, group of 32 query heads).
// Per 64-token page: S = Q K^T and O += P V on the warpgroup tensor cores (wgmma, bf16 in, fp32
// accumulate, every operand read from shared memory), online softmax in base 2, P rounded to bf16.
// One page in shared memory serves K (576 columns) and V (its first 512 columns); pages and the
// query rows sit in the 128-byte swizzled layout of common/wgmma.cuh (9 column blocks of 64
// values). Pages stream through a 2-stage pipeline of 16-byte cp.async copies; rows beyond the
// sequence length are zero-filled, never loaded. (The mma.sync version of this body measured 2.1
// us of math per page on the H200; one bulk copy per row and L2 prefetches of the next pages were
// slower than cp.async and were dropped.)
//
// Warpgroup roles (2 warpgroups, 256 threads):
//   scores:  S^T = K Q^T (M = 64 tokens, N = 32 heads); warpgroup g takes the k16 steps 2 s + g
//            (s < 18); the two partials are added in order by the softmax.
//   softmax: thread t owns head row t/8, tokens 8*(t%8)..+7; writes P (bf16) as [head][token].
//   P V:     O^T = V^T P^T (M = 64 latent columns per wgmma, N = 32 heads, K = 64 tokens);
//            warpgroup g owns the output columns 256g..256g+255.
#pragma once

#include <cmath>
#include <cstdint>

#include <encore/ops/mla.h>

#include "common/launch.cuh"
#include "common/wgmma.cuh"
#include "mla/mla_combine.cuh"
#include "mla/mla_device.cuh"
#include "mla/mla_plan.h"

namespace encore::ops::mla {

struct SplitKvConfig {
  static constexpr int kRows = 32;  // query heads per tile (the wgmma N)
  static constexpr int kStages = 2;
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
};

static_assert(SplitKvConfig::kWarpgroups == 2 && SplitKvConfig::kKStepsPerGroup * 16 * 2 == kMlaRowDim);
static_assert(SplitKvConfig::kRows * SplitKvConfig::kOutStride * 4 <= SplitKvConfig::kPageBytes,
              "O is staged in a page stage");

// How the tile moves pages and which phases it runs. kCpAsync is the op; the others exist for the
// benchmark's account of the time (loads without the math; the math without loads after the
// first stages, on stale data).
enum class SplitKvVariant { kCpAsync, kLoadsOnly, kComputeOnly };

struct SplitKvSmem {
  char* page;             // [kStages][kColBlocks][64 tokens x 128 B], swizzled
  char* q;                // [kColBlocks][32 heads x 128 B], swizzled
  char* probs;            // [32 heads x 128 B]: P as bf16, swizzled
  float* partial;         // [kWarpgroups][32][kPartialStride]: scores of each k half
  float* row_max;         // [32] running max, log2 domain
  float* row_sum;         // [32] running sum of p (fp32)
  float* row_alpha;       // [32] rescale factor of the current page

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
    page = a.take<char>(std::size_t(SplitKvConfig::kStages) * SplitKvConfig::kPageBytes, encore::device::kSwizzleAtomBytes);
    q = a.take<char>(std::size_t(SplitKvConfig::kColBlocks) * SplitKvConfig::kQColBlockBytes, encore::device::kSwizzleAtomBytes);
    probs = a.take<char>(SplitKvConfig::kRows * 128, encore::device::kSwizzleAtomBytes);
    partial = a.take<float>(SplitKvConfig::kWarpgroups * SplitKvConfig::kRows * SplitKvConfig::kPartialStride);
    row_max = a.take<float>(SplitKvConfig::kRows);
    row_sum = a.take<float>(SplitKvConfig::kRows);
    row_alpha = a.take<float>(SplitKvConfig::kRows);
    bytes = pad + a.used();
  }
  std::size_t bytes;
};

inline std::size_t mla_splitkv_smem_bytes() { return SplitKvSmem(nullptr).bytes; }

__host__ __device__ inline int head_groups(int num_heads) { return (num_heads + SplitKvConfig::kRows - 1) / SplitKvConfig::kRows; }

namespace detail_splitkv {

using Cfg = SplitKvConfig;

// Copy placement: thread t moves 16-byte chunk t % 8 of rows t / 8 (+ 32) of every column block,
// so its shared and global offsets are the same for every page and block up to constants.
static_assert(kBlockThreads == 8 * 32, "8 chunks x 32 rows per column block and pass");
__device__ __forceinline__ int copy_row() { return threadIdx.x / 8; }
__device__ __forceinline__ int copy_smem_offset() { return encore::device::swizzled_offset(copy_row(), threadIdx.x % 8); }
__device__ __forceinline__ int copy_elem_offset() { return copy_row() * kMlaRowDim + (threadIdx.x % 8) * 8; }

// The tile's 32 query rows of request `req` -> q (swizzled); heads beyond num_heads are zero.
__device__ __forceinline__ void load_q(const MlaAttentionParams& p, int req, int group, char* q) {
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

// Page `page_id` -> one stage (swizzled); token rows >= valid_tokens are zero-filled. A page id
// outside the pool is never read: the stage is zero-filled and the step is flagged. Called by all
// threads.
__device__ __forceinline__ void load_page(const MlaAttentionParams& p, std::int32_t page_id, int valid_tokens, char* stage) {
  if (page_id < 0 || page_id >= p.cache.num_pages) {
    if (threadIdx.x == 0) atomicOr(p.error_flag, kMlaErrorPageId);
    valid_tokens = 0;
    page_id = 0;
  }
  const __nv_bfloat16* src = p.cache.pages + std::int64_t(page_id) * kMlaPageTokens * kMlaRowDim + copy_elem_offset();
  char* dst = stage + copy_smem_offset();
  const int lo_bytes = copy_row() < valid_tokens ? 16 : 0, hi_bytes = copy_row() + 32 < valid_tokens ? 16 : 0;
#pragma unroll
  for (int b = 0; b < Cfg::kColBlocks; ++b) {
    device::cp_async_16(dst + b * Cfg::kColBlockBytes, src + b * Cfg::kBlockCols, lo_bytes);
    device::cp_async_16(dst + b * Cfg::kColBlockBytes + 32 * 128, src + 32 * kMlaRowDim + b * Cfg::kBlockCols, hi_bytes);
  }
}

// Fused combine staging in the free page stages: combine_items' reduction space, the slice's
// weights, then its partials. A slice holds at most items / splits + 1 float4 items of each split
// and spans at most items / splits / 128 + 2 head rows, so items + splits float4 and 8 splits + 128
// bytes of weights bound it (checked against the stages by fused_combine_fits).
__host__ __device__ inline int fused_combine_weight_bytes(int slice_heads, int splits) { return (slice_heads * splits * 4 + 15) / 16 * 16; }
__host__ __device__ inline bool fused_combine_fits(int max_splits) {
  const int items = SplitKvConfig::kRows * kFloat4PerRow;
  return kCombineRedBytes + (items + max_splits) * 16 + 8 * max_splits + 128 + 16 <=
         std::size_t(SplitKvConfig::kStages) * SplitKvConfig::kPageBytes;
}

__device__ __forceinline__ std::int32_t* fused_counter(const MlaAttentionParams& p, int req, int group) {
  return p.counters + std::int64_t(req) * head_groups(p.num_heads) + group;
}

// Fused combine, arrival: this part's partial of (request, head group) is written (by all
// threads, before the barrier); the release increment orders it before the count.
__device__ __forceinline__ void fused_arrive(std::int32_t* counter) {
  __syncthreads();
  if (threadIdx.x == 0) device::add_release_gpu(counter, 1);
}

// Slice `split_idx` of `splits` of a head group's float4 items: what that part merges.
struct ItemRange {
  int begin, end;
};
__device__ inline ItemRange fused_combine_slice(const MlaAttentionParams& p, int group, int split_idx, int splits) {
  const int head0 = group * Cfg::kRows, heads = min(Cfg::kRows, p.num_heads - head0);
  const int items = heads * kFloat4PerRow, item0 = head0 * kFloat4PerRow;
  return {item0 + split_idx * items / splits, item0 + (split_idx + 1) * items / splits};
}

// Fused combine of one split request: wait until all `splits` parts have arrived, merge slice
// `split_idx` of the group's float4 items (disjoint slices, mla_combine's order), then leave; the
// last part to leave (count 2 splits) resets the counter to zero for the next call. The slice's
// partials are copied into `smem` (the free page stages) in one round, their weights computed
// meanwhile: the merge costs a few L2 / DRAM round trips, not one per pass of items. A flagged step
// merges nothing but still keeps the counter protocol.
__device__ inline void fused_combine(const MlaAttentionParams& p, int req, int group, int split_idx, bool write,
                                     std::int32_t* counter, char* smem) {
  const int first = p.num_splits[req];
  const int splits = p.num_splits[req + 1] - first;
  if (threadIdx.x == 0)
    while (device::load_acquire_gpu(counter) < splits) __nanosleep(32);
  __syncthreads();  // (with thread 0's acquire: the other parts' partials are visible to all)
  const auto [begin, end] = fused_combine_slice(p, group, split_idx, splits);
  if (write && begin < end) {  // uniform over the block
    const int n = end - begin, h_lo = begin / kFloat4PerRow, slice_heads = (end - 1) / kFloat4PerRow - h_lo + 1;
    float4* red = reinterpret_cast<float4*>(smem);
    float* weight = reinterpret_cast<float*>(smem + kCombineRedBytes);  // [heads of the slice][splits]
    float4* staged = reinterpret_cast<float4*>(smem + kCombineRedBytes + fused_combine_weight_bytes(slice_heads, splits));  // [splits][n]
    const std::int64_t slot_stride = std::int64_t(p.num_heads) * kFloat4PerRow;
    const float4* po = reinterpret_cast<const float4*>(p.partial_o) + std::int64_t(first) * slot_stride + begin;
    for (int idx = threadIdx.x; idx < splits * n; idx += kBlockThreads) {
      const int i = idx / n;
      device::cp_async_16(staged + idx, po + i * slot_stride + (idx - i * n));
    }
    device::cp_async_commit();
    for (int idx = threadIdx.x; idx < slice_heads * splits; idx += kBlockThreads)
      weight[idx] = __ldcg(p.partial_lse + std::int64_t(first + idx % splits) * p.num_heads + h_lo + idx / splits);
    __syncthreads();  // the LSEs are in place
    const int warp = threadIdx.x / 32;
    for (int h = h_lo + warp; h < h_lo + slice_heads; h += kWarpsPerBlock) {
      const float lse = combine_weights_from_lse(splits, weight + (h - h_lo) * splits);
      // The slice holding a row's first item writes the row's LSE.
      if (threadIdx.x % 32 == 0 && h * kFloat4PerRow >= begin) p.lse[std::int64_t(req) * p.num_heads + h] = lse;
    }
    device::cp_async_wait<0>();
    __syncthreads();  // weights and the staged partials are in place
    combine_items(p, req, splits, begin, end, weight, h_lo, red, PartialsStaged{staged, begin, n});  // ends with a barrier
  }
  if (threadIdx.x == 0 && atomicAdd(counter, 1) == 2 * splits - 1) atomicExch(counter, 0);
}

// A request split in exactly two is merged by the part holding its split 0, in that split's
// epilogue: split 0 is the part's last request and split 1 the next part's first, long done by
// then, so the owner's own partial never leaves shared memory and nobody waits at the tile's end.
// The partner only arrives. Requests with more splits use fused_combine.
__device__ __forceinline__ bool fused_pair(const MlaAttentionParams& p, int req) { return p.num_splits[req + 1] - p.num_splits[req] == 2; }

// Where combine_items reads a pair's splits: split 0 from this part's unnormalised O rows in
// shared memory, scaled by 1 / l exactly as its partial would have been stored, split 1 staged.
struct PairPartials {
  const float* o_stage;   // [rows][kOutStride]
  const float* row_sum;   // [rows]
  const float4* partner;  // [rows][128]
  int item0;              // item of row 0
  __device__ float4 operator()(int i, int item) const {
    const int it = item - item0;
    if (i == 1) return partner[it];
    const int row = it / kFloat4PerRow;
    const float l = row_sum[row];
    const float inv = l > 0.f ? 1.f / l : 0.f;
    const float4 v = *reinterpret_cast<const float4*>(o_stage + row * Cfg::kOutStride + (it % kFloat4PerRow) * 4);
    return make_float4(v.x * inv, v.y * inv, v.z * inv, v.w * inv);
  }
};

// Pair merge (all threads), split 0's epilogue: o_stage holds this part's unnormalised O rows
// ([32][kOutStride], fp32), sm.row_sum / row_max their statistics. Waits for split 1, stages its
// partial after o_stage, and merges with combine_items: the same bits as storing split 0 and
// merging both. Resets the counter.
static_assert(Cfg::kWarpgroups * Cfg::kRows * Cfg::kPartialStride * 4 >= kCombineRedBytes, "the pair merge reduces in the score partials");
static_assert(Cfg::kRows * (Cfg::kOutStride + kMlaLatentDim) * 4 <= Cfg::kStages * Cfg::kPageBytes, "O and the partner's partial fit the stages");
__device__ inline void fused_pair_merge(const MlaAttentionParams& p, int req, int group, const SplitKvSmem& sm, const float* o_stage) {
  std::int32_t* counter = fused_counter(p, req, group);
  const int partner = p.num_splits[req] + 1;
  const int head0 = group * Cfg::kRows, heads = min(Cfg::kRows, p.num_heads - head0);
  if (threadIdx.x == 0)
    while (device::load_acquire_gpu(counter) < 1) __nanosleep(32);
  __syncthreads();  // (with thread 0's acquire: the partner's partial is visible to all)
  float4* staged = reinterpret_cast<float4*>(sm.page + Cfg::kRows * Cfg::kOutStride * 4);  // [heads][128]
  const float4* src = reinterpret_cast<const float4*>(p.partial_o + (std::int64_t(partner) * p.num_heads + head0) * kMlaLatentDim);
  for (int it = threadIdx.x; it < heads * kFloat4PerRow; it += kBlockThreads) device::cp_async_16(staged + it, src + it);
  device::cp_async_commit();
  float* weight = reinterpret_cast<float*>(sm.probs);  // [heads][2]: the splits' LSEs, then their weights
  if (threadIdx.x < heads) {
    const int row = threadIdx.x;
    const float l = sm.row_sum[row];
    weight[2 * row] = l > 0.f ? (sm.row_max[row] + log2f(l)) * 0.6931471805599453f : -INFINITY;  // as its partial LSE
    weight[2 * row + 1] = __ldcg(p.partial_lse + std::int64_t(partner) * p.num_heads + head0 + row);
  }
  __syncthreads();
  for (int h = threadIdx.x / 32; h < heads; h += kWarpsPerBlock) {
    const float lse = combine_weights_from_lse(2, weight + 2 * h);
    if (threadIdx.x % 32 == 0) p.lse[std::int64_t(req) * p.num_heads + head0 + h] = lse;
  }
  device::cp_async_wait<0>();
  __syncthreads();  // weights and the partner's partial are in place
  const int item0 = head0 * kFloat4PerRow;
  combine_items(p, req, 2, item0, item0 + heads * kFloat4PerRow, weight, head0, reinterpret_cast<float4*>(sm.partial),
                PairPartials{o_stage, sm.row_sum, staged, item0});  // ends with a barrier
  if (threadIdx.x == 0) atomicExch(counter, 0);  // the partner arrived once and is gone
}

// Pair owner without math (flagged step): keeps the protocol, writes nothing.
__device__ __forceinline__ void fused_pair_skip(std::int32_t* counter) {
  if (threadIdx.x == 0) {
    while (device::load_acquire_gpu(counter) < 1) __nanosleep(32);
    atomicExch(counter, 0);
  }
}

// The pages of request `req` that a part computes: page_begin .. page_begin + num_pages - 1 of the
// request (tokens below token_end), and the ids of the first kStages of them, read speculatively
// with the length (one round trip; clamped into the table row, used only for pages that exist).
struct RequestPages {
  int len, page_begin, token_end, num_pages;
  std::int32_t first_ids[Cfg::kStages];
  __device__ int valid_tokens(int j) const { return min(token_end - (page_begin + j) * kMlaPageTokens, kMlaPageTokens); }
  // Page j holds the request's newest row: the one mla_kv_append writes in this step (the
  // scheduler flags any position but len - 1).
  __device__ bool newest(int j) const { return page_begin + j == (len - 1) / kMlaPageTokens; }
};
__device__ inline RequestPages request_pages(const MlaAttentionParams& p, const std::int32_t* meta, int req) {
  RequestPages r;
  r.page_begin = req == meta[kMetaBeginReq] ? meta[kMetaBeginPage] : 0;
#pragma unroll
  for (int s = 0; s < Cfg::kStages; ++s) r.first_ids[s] = page_id_of(p, req, min(r.page_begin + s, p.cache.max_pages_per_seq - 1));
  r.len = p.seq_lens[req];
  const int page_end_plan = req == meta[kMetaEndReq] ? meta[kMetaEndPage] : plan_pages(r.len, 1 << 30);
  // Pages that hold at least one token (a zero-length request has none).
  r.token_end = min(r.len, page_end_plan * kMlaPageTokens);
  r.num_pages = max((r.token_end + kMlaPageTokens - 1) / kMlaPageTokens - r.page_begin, 0);
  return r;
}

// Plan settled (MlaAttentionParams::plan_settled), before griddepcontrol.wait: starts the copies
// of the part's first pages but the newest (left uncommitted: they join the first request's first
// copy group). Returns the first request's pages for splitkv_part.
__device__ inline RequestPages start_settled_pages(const MlaAttentionParams& p, const std::int32_t* meta, char* smem_base) {
  const RequestPages r = request_pages(p, meta, meta[kMetaBeginReq]);
  char* stages = SplitKvSmem(smem_base).page;
#pragma unroll
  for (int s = 0; s < Cfg::kStages; ++s)
    if (s < r.num_pages && !r.newest(s)) load_page(p, r.first_ids[s], r.valid_tokens(s), stages + s * Cfg::kPageBytes);
  return r;
}

}  // namespace detail_splitkv

// Every (request, page range) of one part for the heads of `group`: scores, online softmax and
// P V per page, then the final output or this split's partial (and, fused, the arrival).
// `started`: the first request's pages, whose copies start_settled_pages() began (when early).
template <SplitKvVariant kVariant, bool kFusedCombine>
__device__ inline void splitkv_part(const MlaAttentionParams& p, int group, const std::int32_t* meta, char* smem_base,
                                    bool early_start, detail_splitkv::RequestPages started) {
  using Cfg = SplitKvConfig;
  using namespace detail_splitkv;
  namespace dev = encore::device;
  constexpr bool kMath = kVariant != SplitKvVariant::kLoadsOnly;
  const int begin_req = meta[kMetaBeginReq], end_req = meta[kMetaEndReq];
  SplitKvSmem sm(smem_base);
  // Warp index through a shuffle so the compiler knows it is warp-uniform: the descriptors
  // derived from it then live in uniform registers (no per-wgmma conversions).
  const int warp = __shfl_sync(0xffffffffu, threadIdx.x / 32, 0), lane = threadIdx.x % 32;
  const int wg = warp / 4, wg_warp = warp % 4;  // warpgroup, warp within it
  const float scale_log2 = p.softmax_scale * 1.4426950408889634f;  // scores in log2 units, fp32
  // Operand descriptors at this warpgroup's first k step (scores: k steps 2 s + wg, so step s
  // sits in column block s / 2 at +32 (2 (s % 2) + wg) bytes) and first output column block.
  const dev::WgmmaDesc q_desc(sm.q + wg * 32, dev::kSwizzleAtomBytes);
  const dev::WgmmaDesc k_desc(sm.page + wg * 32, dev::kSwizzleAtomBytes);
  const dev::WgmmaDesc v_desc(sm.page + wg * Cfg::kOutBlocksPerGroup * Cfg::kColBlockBytes, dev::kSwizzleAtomBytes);
  const dev::WgmmaDesc p_desc(sm.probs, dev::kSwizzleAtomBytes);

  for (int req = begin_req; req <= end_req; ++req) {
    const bool early = early_start && req == begin_req;  // its settled pages are copying already
    const RequestPages r = early ? started : request_pages(p, meta, req);
    const int page_begin = r.page_begin, token_end = r.token_end, num_pages = r.num_pages;
    const int split_idx = req == begin_req ? meta[kMetaBeginSplit] : 0;
    const int split_base = p.num_splits[req];
    const bool is_split = p.num_splits[req + 1] - split_base > 1;

    __syncthreads();  // previous request's readers of q / stats / staged O are done
    if (threadIdx.x < Cfg::kRows) {
      sm.row_max[threadIdx.x] = -INFINITY;
      sm.row_sum[threadIdx.x] = 0.f;
    }
    load_q(p, req, group, sm.q);  // lands with the first stage's group (as do pages started early)
    for (int s = 0; s < Cfg::kStages; ++s) {
      if (s < num_pages && !(early && !r.newest(s))) load_page(p, r.first_ids[s], r.valid_tokens(s), sm.page + s * Cfg::kPageBytes);
      device::cp_async_commit();
    }

    float acc[Cfg::kOutBlocksPerGroup][16];  // O^T: [m64 column block][fragment]
#pragma unroll
    for (int cb = 0; cb < Cfg::kOutBlocksPerGroup; ++cb)
#pragma unroll
      for (int e = 0; e < 16; ++e) acc[cb][e] = 0.f;

    for (int i = 0; i < num_pages; ++i) {
      const int pg = page_begin + i;
      const int valid_tokens = min(token_end - pg * kMlaPageTokens, kMlaPageTokens);
      const int stage = i % Cfg::kStages;
      const std::int32_t next_id = i + Cfg::kStages < num_pages ? page_id_of(p, req, pg + Cfg::kStages) : 0;
      device::cp_async_wait<Cfg::kStages - 1>();
      dev::fence_proxy_async();  // this thread's copies, visible to the tensor cores' reads
      __syncthreads();
      const std::uint32_t stage_off = stage * Cfg::kPageBytes;

      // ---- scores S^T = K Q^T: 64 tokens x 32 heads per warpgroup over its k half
      if constexpr (kMath) {
        float s_acc[16];
        dev::wgmma_fence();
#pragma unroll
        for (int s = 0; s < Cfg::kKStepsPerGroup; ++s) {
          const int step_off = (s / 2) * Cfg::kColBlockBytes + (s % 2) * 64, q_off = (s / 2) * Cfg::kQColBlockBytes + (s % 2) * 64;
          dev::wgmma_m64n32k16_bf16<0>(s_acc, k_desc.at(stage_off + step_off), q_desc.at(q_off), s > 0);
        }
        dev::wgmma_commit();
        dev::wgmma_wait<0>();
        // Fragment (token 16 w + lane/4 (+8), head 8 j + 2 (lane%4) (+1)) -> partial[wg][head][token].
        float* part = sm.partial + wg * Cfg::kRows * Cfg::kPartialStride;
#pragma unroll
        for (int e = 0; e < 16; ++e) {
          const int token = 16 * wg_warp + lane / 4 + 8 * ((e / 2) % 2), head = 8 * (e / 4) + 2 * (lane % 4) + e % 2;
          part[head * Cfg::kPartialStride + token] = s_acc[e];
        }
      }
      __syncthreads();

      // ---- online softmax: 8 threads per row, 8 tokens each
      bool max_moved = false;  // some row's max rose: O must be rescaled
      if constexpr (kMath) {
        const int row = threadIdx.x / 8, sub = threadIdx.x % 8;
        float s[8] = {};
#pragma unroll
        for (int half = 0; half < Cfg::kWarpgroups; ++half) {  // k halves added in a fixed order
          const float* part = sm.partial + (half * Cfg::kRows + row) * Cfg::kPartialStride + sub * 8;
          const float4 lo = *reinterpret_cast<const float4*>(part), hi = *reinterpret_cast<const float4*>(part + 4);
          s[0] += lo.x, s[1] += lo.y, s[2] += lo.z, s[3] += lo.w;
          s[4] += hi.x, s[5] += hi.y, s[6] += hi.z, s[7] += hi.w;
        }
        float page_max = -INFINITY;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          s[j] = sub * 8 + j < valid_tokens ? s[j] * scale_log2 : -INFINITY;
          page_max = fmaxf(page_max, s[j]);
        }
        const float old_max = sm.row_max[row];
#pragma unroll
        for (int o = 1; o < 8; o <<= 1) page_max = fmaxf(page_max, __shfl_xor_sync(0xffffffffu, page_max, o));
        const float new_max = fmaxf(old_max, page_max);  // finite: every page holds a valid token
        float sum = 0.f;
        std::uint32_t packed[4];
#pragma unroll
        for (int j = 0; j < 8; j += 2) {
          const float p0 = exp2f(s[j] - new_max), p1 = exp2f(s[j + 1] - new_max);
          sum += p0 + p1;  // fp32 sum: keeps the LSE exact to fp32 (P itself goes to bf16)
          packed[j / 2] = device::pack_bf16x2(p0, p1);
        }
        *reinterpret_cast<uint4*>(sm.probs + dev::swizzled_offset(row, sub)) = make_uint4(packed[0], packed[1], packed[2], packed[3]);
        dev::fence_proxy_async();  // P is read by the tensor cores
#pragma unroll
        for (int o = 1; o < 8; o <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        __syncwarp();  // every lane of the row has read row_max before lane 0 updates it
        if (sub == 0) {
          const float alpha = exp2f(old_max - new_max);  // 0 on the first page
          sm.row_alpha[row] = alpha;
          sm.row_sum[row] = sm.row_sum[row] * alpha + sum;
          sm.row_max[row] = new_max;
          max_moved = alpha != 1.f;
        }
      }
      const bool rescale = __syncthreads_or(max_moved);  // (x 1 is exact: skipping it changes no bit)

      // ---- O^T = alpha O^T + V^T P^T: 4 blocks of 64 columns x 32 heads per warpgroup, k = 64 tokens
      if constexpr (kMath) {
        if (rescale) {
          float alpha[8];  // heads 8 j + 2 (lane%4) + {0, 1}
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            alpha[2 * j] = sm.row_alpha[8 * j + 2 * (lane % 4)];
            alpha[2 * j + 1] = sm.row_alpha[8 * j + 2 * (lane % 4) + 1];
          }
#pragma unroll
          for (int cb = 0; cb < Cfg::kOutBlocksPerGroup; ++cb)
#pragma unroll
            for (int e = 0; e < 16; ++e) acc[cb][e] *= alpha[2 * (e / 4) + e % 2];
        }
        dev::wgmma_fence();
#pragma unroll
        for (int cb = 0; cb < Cfg::kOutBlocksPerGroup; ++cb)
#pragma unroll
          for (int ks = 0; ks < kMlaPageTokens / 16; ++ks) {
            dev::wgmma_m64n32k16_bf16<1>(acc[cb], v_desc.at(stage_off + cb * Cfg::kColBlockBytes + ks * 16 * 128), p_desc.at(ks * 32), true);
          }
        dev::wgmma_commit();
        dev::wgmma_wait<0>();
      }
      __syncthreads();  // stage, scores and probs free again

      if (i + Cfg::kStages < num_pages && kVariant != SplitKvVariant::kComputeOnly) {
        const int next = pg + Cfg::kStages;
        load_page(p, next_id, min(token_end - next * kMlaPageTokens, kMlaPageTokens), sm.page + stage * Cfg::kPageBytes);
      }
      device::cp_async_commit();
    }
    device::cp_async_wait<0>();  // no copy outlives the request
    __syncthreads();

    // ---- epilogue: O / l and the LSE (natural log) of each row, final or partial slot. O goes
    // through a free stage so the global stores are whole rows.
    const int slot = split_base + split_idx;
    float* o_base = is_split ? p.partial_o + std::int64_t(slot) * p.num_heads * kMlaLatentDim
                             : p.o_lat + std::int64_t(req) * p.num_heads * kMlaLatentDim;
    float* lse_base = is_split ? p.partial_lse + std::int64_t(slot) * p.num_heads : p.lse + std::int64_t(req) * p.num_heads;
    float* o_stage = reinterpret_cast<float*>(sm.page);  // [32][kOutStride]
#pragma unroll
    for (int cb = 0; cb < Cfg::kOutBlocksPerGroup; ++cb)
#pragma unroll
      for (int e = 0; e < 16; ++e) {
        const int col = (wg * Cfg::kOutBlocksPerGroup + cb) * Cfg::kBlockCols + 16 * wg_warp + lane / 4 + 8 * ((e / 2) % 2);
        const int head = 8 * (e / 4) + 2 * (lane % 4) + e % 2;
        o_stage[head * Cfg::kOutStride + col] = acc[cb][e];
      }
    __syncthreads();
    if constexpr (kFusedCombine)
      if (is_split && split_idx == 0 && fused_pair(p, req)) {
        fused_pair_merge(p, req, group, sm, o_stage);
        continue;  // no partial and no arrival: the output is written
      }
    constexpr int kRowFloat4 = kMlaLatentDim / 4;
    for (int it = threadIdx.x; it < Cfg::kRows * kRowFloat4; it += kBlockThreads) {
      const int row = it / kRowFloat4, c4 = it % kRowFloat4;
      const int head = group * Cfg::kRows + row;
      if (head >= p.num_heads) break;  // rows only grow with it
      const float l = sm.row_sum[row];
      const float inv = l > 0.f ? 1.f / l : 0.f;
      const float4 v = *reinterpret_cast<const float4*>(o_stage + row * Cfg::kOutStride + c4 * 4);
      reinterpret_cast<float4*>(o_base + std::int64_t(head) * kMlaLatentDim)[c4] = make_float4(v.x * inv, v.y * inv, v.z * inv, v.w * inv);
    }
    if (threadIdx.x < Cfg::kRows) {
      const int row = threadIdx.x, head = group * Cfg::kRows + row;
      if (head < p.num_heads) {
        const float l = sm.row_sum[row];
        // Empty rows: +inf as a final LSE (spec §9), -inf as a partial one (weight 0 in the combine).
        const float lse = l > 0.f ? (sm.row_max[row] + log2f(l)) * 0.6931471805599453f : (is_split ? -INFINITY : INFINITY);
        lse_base[head] = lse;
      }
    }
    if constexpr (kFusedCombine)
      if (is_split) fused_arrive(fused_counter(p, req, group));
  }
}

// One tile: every (request, page range) of part tile / groups, heads of group tile % groups.
// kFusedCombine: the tiles of a split request merge its partials themselves (fused_pair_merge or
// fused_combine; needs p.counters and all tiles co-resident, which the launcher guarantees).
// The kernel waits for upstream before the tile unless p.plan_settled; then the tile waits itself,
// after starting its settled first pages.
template <SplitKvVariant kVariant = SplitKvVariant::kCpAsync, bool kFusedCombine = false>
__device__ inline void mla_splitkv_tile(const MlaAttentionParams& p, int tile, char* smem_base) {
  using namespace detail_splitkv;
  const int groups = head_groups(p.num_heads);
  const int part = tile / groups, group = tile % groups;
  const std::int32_t* meta = p.sched_meta + part * kMlaMetaInts;
  const int begin_req = meta[kMetaBeginReq];
  if (begin_req < 0) return;
  RequestPages started{};
  if (p.plan_settled) {
    started = start_settled_pages(p, meta, smem_base);
    encore::device::wait_for_upstream();
  }
  // Read once: split-KV itself may OR in kMlaErrorPageId while other tiles run, and the fused
  // tiles must all keep the counter protocol whatever they see.
  const bool flagged = device::step_flagged(p.error_flag);
  if (flagged && p.plan_settled) device::cp_async_wait<0>();  // no copy lands in reused or freed memory
  if (flagged && !kFusedCombine) return;
  const int end_req = meta[kMetaEndReq];
  const bool first_split = meta[kMetaFirstIsSplit] != 0;
  const bool last_split = meta[kMetaLastIsSplit] != 0 && end_req != begin_req;
  // A split request's role in the fused combine: a pair's split 0 merges it in its epilogue, any
  // other piece arrives (and, for more than two splits, merges a slice at the tile's end).
  const bool first_owner = first_split && meta[kMetaBeginSplit] == 0 && fused_pair(p, begin_req);
  const bool last_owner = last_split && fused_pair(p, end_req);  // an end request's piece is its split 0
  if (flagged) {  // (fused only) keep the counter protocol; nothing is computed or written
    if (first_split) {
      if (first_owner) fused_pair_skip(fused_counter(p, begin_req, group));
      else fused_arrive(fused_counter(p, begin_req, group));
    }
    if (last_split) {
      if (last_owner) fused_pair_skip(fused_counter(p, end_req, group));
      else fused_arrive(fused_counter(p, end_req, group));
    }
  } else {
    splitkv_part<kVariant, kFusedCombine>(p, group, meta, smem_base, p.plan_settled, started);
  }
  if constexpr (kFusedCombine) {
    // All arrivals of this tile precede its waits, so no tile waits on one that waits on it.
    __syncthreads();  // the page stages are free (every copy of every request was awaited)
    char* stages = reinterpret_cast<char*>(SplitKvSmem(smem_base).page);
    // The last request first: its other parts ran it at their start, so its counter is complete,
    // while this part's first request waits for the part before, which ends about now.
    if (last_split && !fused_pair(p, end_req)) fused_combine(p, end_req, group, 0, !flagged, fused_counter(p, end_req, group), stages);
    if (first_split && !fused_pair(p, begin_req))
      fused_combine(p, begin_req, group, meta[kMetaBeginSplit], !flagged, fused_counter(p, begin_req, group), stages);
  }
}

}  // namespace encore::ops::mla
