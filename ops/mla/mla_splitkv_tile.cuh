// Split-KV attention body (spec §8): one tile = (scheduler part, group of 32 query heads).
// Per 64-token page: S = Q K^T and O += P V on tensor cores (mma.sync m16n8k16, bf16 in, fp32
// accumulate), online softmax in base 2, P rounded to bf16. One page in shared memory serves K
// (576 columns) and V (its first 512 columns). Pages stream through a 2-stage pipeline of 16-byte
// cp.async copies; rows beyond the sequence length are zero-filled, never loaded. (A variant with
// one bulk copy per 1152-byte row on an mbarrier gives identical results but measured 577 us
// against 388 us at 128 x 8K on the H200, so cp.async is the op's path. Pulling the next 1-4
// pages into L2 with bulk prefetches measured 4-28% slower at 128 x 8K and was dropped.)
//
// Warp roles (8 warps, 256 threads):
//   scores:  S^T = K Q^T. Warp w computes tokens 32*(w%2)..+31 x all 32 heads over the k slice
//            144*(w/2)..+143; its slice of Q^T stays in registers for the whole request (72 regs),
//            so each K element is read from shared memory exactly once per page (Q-in-smem
//            re-read Q and K per warp: 295 KB of smem reads per page; now 74 KB + 64 KB of
//            k-slice partials). The four partials of a score are added in slice order.
//   softmax: thread t owns row t/8, tokens 8*(t%8)..+7
//   P V:     warp w owns output columns 64*w..+63 for all 32 rows
#pragma once

#include <cmath>
#include <cstdint>

#include <encore/ops/mla.h>

#include "common/launch.cuh"
#include "mla/mla_combine.cuh"
#include "mla/mla_device.cuh"
#include "mla/mla_plan.h"

namespace encore::ops::mla {

struct SplitKvConfig {
  static constexpr int kRows = 32;                     // query heads per tile
  static constexpr int kRowStride = kMlaRowDim + 8;    // bf16 elements; +16 B keeps ldmatrix conflict-free
  static constexpr int kStages = 2;
  static constexpr int kKSlices = 4;                        // score warps split k = 576 four ways
  static constexpr int kKSteps = kMlaRowDim / 16 / kKSlices;  // m16n8k16 steps per slice (9)
  static constexpr int kTokenHalves = kWarpsPerBlock / kKSlices;  // score warps per k slice (2)
  static constexpr int kHeadTiles = kRows / 8;              // n8 tiles of heads (4)
  static constexpr int kPartialStride = kMlaPageTokens + 4; // fp32; conflict-free fragment stores
  static constexpr int kProbStride = kMlaPageTokens + 8;    // bf16
  static constexpr int kChunksPerRow = kMlaRowDim / 8;      // 16-byte chunks per cache row
};

static_assert(SplitKvConfig::kKSlices * SplitKvConfig::kTokenHalves == kWarpsPerBlock);
static_assert(SplitKvConfig::kTokenHalves * 32 == kMlaPageTokens);
static_assert(SplitKvConfig::kKSteps * 16 * SplitKvConfig::kKSlices == kMlaRowDim);

// How the tile moves pages and which phases it runs. kCpAsync is the op; the others exist for the
// tests and the benchmark's account of the time (bulk row copies; loads without the math; the
// math without loads after the first stages, on stale data; the last two move pages with bulk
// copies, as they were measured).
enum class SplitKvVariant { kBulk, kCpAsync, kLoadsOnly, kComputeOnly };

struct SplitKvSmem {
  std::uint64_t* bars;    // [kStages] mbarriers of the bulk copies
  __nv_bfloat16* page;    // [kStages][64][kRowStride]
  float* partial;         // [kKSlices][32][kPartialStride]: scores of each k slice
  __nv_bfloat16* probs;   // [32][kProbStride]
  float* row_max;         // [32] running max, log2 domain
  float* row_sum;         // [32] running sum of p (fp32)
  float* row_alpha;       // [32] rescale factor of the current page

  __host__ __device__ explicit SplitKvSmem(char* base) {
    encore::device::SmemAllocator a(base);
    bars = a.take<std::uint64_t>(SplitKvConfig::kStages, 8);
    page = a.take<__nv_bfloat16>(SplitKvConfig::kStages * kMlaPageTokens * SplitKvConfig::kRowStride, 128);
    partial = a.take<float>(SplitKvConfig::kKSlices * SplitKvConfig::kRows * SplitKvConfig::kPartialStride);
    probs = a.take<__nv_bfloat16>(SplitKvConfig::kRows * SplitKvConfig::kProbStride);
    row_max = a.take<float>(SplitKvConfig::kRows);
    row_sum = a.take<float>(SplitKvConfig::kRows);
    row_alpha = a.take<float>(SplitKvConfig::kRows);
    bytes = a.used();
  }
  std::size_t bytes;
};

inline std::size_t mla_splitkv_smem_bytes() { return SplitKvSmem(nullptr).bytes; }

__host__ __device__ inline int head_groups(int num_heads) { return (num_heads + SplitKvConfig::kRows - 1) / SplitKvConfig::kRows; }

namespace detail_splitkv {

using Cfg = SplitKvConfig;

// This warp's k slice of Q^T as mma B fragments (k16 x n8, 4 n-tiles of 8 heads): b0 holds
// Q[head][k + 2(lane%4) .. +1] with head = 8 nt + lane/4, b1 the same 8 columns later. Heads
// beyond num_heads are zero.
using QFrags = std::uint32_t[SplitKvConfig::kKSteps][SplitKvConfig::kHeadTiles][2];
__device__ __forceinline__ void load_q_frags(const MlaAttentionParams& p, int req, int group, int kslice, QFrags& qf) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int nt = 0; nt < Cfg::kHeadTiles; ++nt) {
    const int head = group * Cfg::kRows + nt * 8 + lane / 4;
    const bool valid = head < p.num_heads;
    const std::uint32_t* src = reinterpret_cast<const std::uint32_t*>(
        p.q576 + (std::int64_t(req) * p.num_heads + (valid ? head : 0)) * kMlaRowDim + kslice * Cfg::kKSteps * 16 + 2 * (lane % 4));
#pragma unroll
    for (int ks = 0; ks < Cfg::kKSteps; ++ks) {
      qf[ks][nt][0] = valid ? src[ks * 8] : 0u;
      qf[ks][nt][1] = valid ? src[ks * 8 + 4] : 0u;
    }
  }
}

// Page id of (request, page); read one iteration ahead so its latency hides behind compute.
__device__ __forceinline__ std::int32_t page_id_of(const MlaAttentionParams& p, int req, int page_idx) {
  return p.cache.block_table[std::int64_t(req) * p.cache.block_table_stride + page_idx];
}

// Page `page_id` -> one stage; token rows >= valid_tokens are zero-filled. A page id outside the
// pool is never read: the stage is zero-filled and the step is flagged. Called by all threads.
// Bulk: warp 0 announces the bytes on the stage's mbarrier and issues one copy per row.
template <bool kBulk>
__device__ __forceinline__ void load_page(const MlaAttentionParams& p, std::int32_t page_id, int valid_tokens,
                                          __nv_bfloat16* stage, std::uint64_t* bar) {
  if (page_id < 0 || page_id >= p.cache.num_pages) {
    if (threadIdx.x == 0) atomicOr(p.error_flag, kMlaErrorPageId);
    valid_tokens = 0;
    page_id = 0;
  }
  const __nv_bfloat16* base = p.cache.pages + std::int64_t(page_id) * kMlaPageTokens * kMlaRowDim;
  if constexpr (kBulk) {
    for (int c = threadIdx.x; c < (kMlaPageTokens - valid_tokens) * Cfg::kChunksPerRow; c += kBlockThreads) {
      const int row = valid_tokens + c / Cfg::kChunksPerRow, chunk = c % Cfg::kChunksPerRow;
      *reinterpret_cast<uint4*>(stage + row * Cfg::kRowStride + chunk * 8) = make_uint4(0u, 0u, 0u, 0u);
    }
    if (threadIdx.x < 32) {
      if (threadIdx.x == 0) {
        encore::device::fence_proxy_async();  // the stage's earlier generic reads come first
        encore::device::barrier_arrive_expect(bar, std::uint32_t(valid_tokens) * kMlaRowDim * sizeof(__nv_bfloat16));
      }
      __syncwarp();
      for (int row = threadIdx.x; row < valid_tokens; row += 32)
        encore::device::bulk_copy_to_shared(stage + row * Cfg::kRowStride, base + std::int64_t(row) * kMlaRowDim,
                              kMlaRowDim * sizeof(__nv_bfloat16), bar);
    }
  } else {
    for (int c = threadIdx.x; c < kMlaPageTokens * Cfg::kChunksPerRow; c += kBlockThreads) {
      const int row = c / Cfg::kChunksPerRow, chunk = c % Cfg::kChunksPerRow;
      const bool valid = row < valid_tokens;
      device::cp_async_16(stage + row * Cfg::kRowStride + chunk * 8, base + (valid ? row * kMlaRowDim + chunk * 8 : 0),
                          valid ? 16 : 0);
    }
  }
}

__device__ __forceinline__ std::int32_t* fused_counter(const MlaAttentionParams& p, int req, int group) {
  return p.counters + std::int64_t(req) * head_groups(p.num_heads) + group;
}

// Fused combine, arrival: this part's partial of (request, head group) is written (by all
// threads, before the barrier); the release orders it before the increment.
__device__ __forceinline__ void fused_arrive(std::int32_t* counter) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(counter, 1);
  }
}

// Fused combine of one split request: wait until all `splits` parts have arrived, merge slice
// `split_idx` of the group's float4 items (disjoint slices, mla_combine's order), then leave; the
// last part to leave (count 2 splits) resets the counter to zero for the next call. `smem`: the
// free page stages. A flagged step merges nothing but still keeps the counter protocol.
__device__ inline void fused_combine(const MlaAttentionParams& p, int req, int group, int split_idx, bool write,
                                     std::int32_t* counter, char* smem) {
  const int first = p.num_splits[req];
  const int splits = p.num_splits[req + 1] - first;
  if (threadIdx.x == 0) {
    while (device::load_acquire_gpu(counter) < splits) __nanosleep(32);
    __threadfence();
  }
  __syncthreads();
  if (write) {
    const int warp = threadIdx.x / 32;
    const int head0 = group * Cfg::kRows, heads = min(Cfg::kRows, p.num_heads - head0);
    const int items = heads * kFloat4PerRow, item0 = head0 * kFloat4PerRow;
    const int begin = item0 + split_idx * items / splits, end = item0 + (split_idx + 1) * items / splits;
    if (begin < end) {  // uniform over the block
      float4* red = reinterpret_cast<float4*>(smem);
      float* weight = reinterpret_cast<float*>(smem + kCombineRedBytes);  // [heads of the slice][splits]
      const int h_lo = begin / kFloat4PerRow, h_hi = (end - 1) / kFloat4PerRow;
      for (int h = h_lo + warp; h <= h_hi; h += kWarpsPerBlock) {
        const float lse = combine_weights_warp(p.partial_lse + std::int64_t(first) * p.num_heads + h, p.num_heads, splits,
                                               weight + (h - h_lo) * splits);
        // The slice holding a row's first item writes the row's LSE.
        if (threadIdx.x % 32 == 0 && h * kFloat4PerRow >= begin) p.lse[std::int64_t(req) * p.num_heads + h] = lse;
      }
      __syncthreads();
      combine_items(p, req, first, splits, begin, end, weight, h_lo, red);  // ends with a barrier
    }
  }
  if (threadIdx.x == 0 && atomicAdd(counter, 1) == 2 * splits - 1) atomicExch(counter, 0);
}

}  // namespace detail_splitkv

// Every (request, page range) of one part for the heads of `group`: scores, online softmax and
// P V per page, then the final output or this split's partial (and, fused, the arrival).
template <SplitKvVariant kVariant, bool kFusedCombine>
__device__ inline void splitkv_part(const MlaAttentionParams& p, int group, const std::int32_t* meta, char* smem_base) {
  using Cfg = SplitKvConfig;
  using namespace detail_splitkv;
  constexpr bool kBulk = kVariant != SplitKvVariant::kCpAsync;
  constexpr bool kMath = kVariant != SplitKvVariant::kLoadsOnly;
  const int begin_req = meta[kMetaBeginReq], end_req = meta[kMetaEndReq];
  SplitKvSmem sm(smem_base);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const float scale_log2 = p.softmax_scale * 1.4426950408889634f;  // scores in log2 units, fp32
  if (kBulk && threadIdx.x == 0) {
    for (int s = 0; s < Cfg::kStages; ++s) encore::device::barrier_init(&sm.bars[s], 1);  // first use after the request's barrier
    encore::device::fence_barrier_init();
  }
  std::uint32_t phases = 0;  // bit s: parity of stage s's next completion

  for (int req = begin_req; req <= end_req; ++req) {
    const int len = p.seq_lens[req];
    const int page_begin = req == begin_req ? meta[kMetaBeginPage] : 0;
    const int page_end_plan = req == end_req ? meta[kMetaEndPage] : plan_pages(len, 1 << 30);
    const int split_idx = req == begin_req ? meta[kMetaBeginSplit] : 0;
    const int split_base = p.num_splits[req];
    const bool is_split = p.num_splits[req + 1] - split_base > 1;
    // Pages that hold at least one token (a zero-length request has none).
    const int token_end = min(len, page_end_plan * kMlaPageTokens);
    const int num_pages = max((token_end + kMlaPageTokens - 1) / kMlaPageTokens - page_begin, 0);

    __syncthreads();  // previous request's readers of q / stats are done
    if (threadIdx.x < Cfg::kRows) {
      sm.row_max[threadIdx.x] = -INFINITY;
      sm.row_sum[threadIdx.x] = 0.f;
    }
    QFrags qf;
    load_q_frags(p, req, group, warp / Cfg::kTokenHalves, qf);
    for (int s = 0; s < Cfg::kStages; ++s) {
      if (s < num_pages) {
        const int pg = page_begin + s;
        load_page<kBulk>(p, page_id_of(p, req, pg), min(token_end - pg * kMlaPageTokens, kMlaPageTokens),
                         sm.page + s * kMlaPageTokens * Cfg::kRowStride, &sm.bars[s]);
      }
      device::cp_async_commit();
    }

    float acc[2][8][4];  // [m-tile][n-tile of 8 columns][fragment]
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.f;

    for (int i = 0; i < num_pages; ++i) {
      const int pg = page_begin + i;
      const int valid_tokens = min(token_end - pg * kMlaPageTokens, kMlaPageTokens);
      const __nv_bfloat16* kv = sm.page + (i % Cfg::kStages) * kMlaPageTokens * Cfg::kRowStride;
      const std::int32_t next_id = i + Cfg::kStages < num_pages ? page_id_of(p, req, pg + Cfg::kStages) : 0;
      const int stage = i % Cfg::kStages;
      if constexpr (kBulk) {
        if (kVariant != SplitKvVariant::kComputeOnly || i < Cfg::kStages) {
          encore::device::barrier_wait(&sm.bars[stage], (phases >> stage) & 1u);
          phases ^= 1u << stage;
        }
      } else {
        device::cp_async_wait<Cfg::kStages - 1>();
      }
      __syncthreads();

      // ---- scores S^T = K Q^T: 32 tokens x 32 heads per warp over its k slice
      if constexpr (kMath) {
        const int half = warp % Cfg::kTokenHalves, kslice = warp / Cfg::kTokenHalves;
        float s_acc[2][Cfg::kHeadTiles][4] = {};  // [token m-tile][head n-tile][fragment]
        const __nv_bfloat16* a_ptr =
            kv + (half * 32 + lane % 16) * Cfg::kRowStride + kslice * Cfg::kKSteps * 16 + (lane / 16) * 8;
#pragma unroll
        for (int ks = 0; ks < Cfg::kKSteps; ++ks)
#pragma unroll
          for (int mt = 0; mt < 2; ++mt) {
            std::uint32_t a[4];
            device::ldmatrix_x4(a, a_ptr + mt * 16 * Cfg::kRowStride + ks * 16);
#pragma unroll
            for (int nt = 0; nt < Cfg::kHeadTiles; ++nt) device::mma_bf16_16816(s_acc[mt][nt], a, qf[ks][nt][0], qf[ks][nt][1]);
          }
        // Fragment (token lane/4 (+8), heads 2(lane%4) + {0, 1}) -> partial[kslice][head][token].
        float* part = sm.partial + kslice * Cfg::kRows * Cfg::kPartialStride;
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int nt = 0; nt < Cfg::kHeadTiles; ++nt) {
            const int token = half * 32 + mt * 16 + lane / 4, head = nt * 8 + 2 * (lane % 4);
            part[head * Cfg::kPartialStride + token] = s_acc[mt][nt][0];
            part[(head + 1) * Cfg::kPartialStride + token] = s_acc[mt][nt][1];
            part[head * Cfg::kPartialStride + token + 8] = s_acc[mt][nt][2];
            part[(head + 1) * Cfg::kPartialStride + token + 8] = s_acc[mt][nt][3];
          }
      }
      __syncthreads();

      // ---- online softmax: 8 threads per row, 8 tokens each
      if constexpr (kMath) {
        const int row = threadIdx.x / 8, sub = threadIdx.x % 8;
        float s[8] = {};
#pragma unroll
        for (int ksl = 0; ksl < Cfg::kKSlices; ++ksl) {  // k slices added in a fixed order
          const float* part = sm.partial + (ksl * Cfg::kRows + row) * Cfg::kPartialStride + sub * 8;
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
          const __nv_bfloat162 pr = __floats2bfloat162_rn(p0, p1);
          packed[j / 2] = *reinterpret_cast<const std::uint32_t*>(&pr);
        }
        *reinterpret_cast<uint4*>(sm.probs + row * Cfg::kProbStride + sub * 8) =
            make_uint4(packed[0], packed[1], packed[2], packed[3]);
#pragma unroll
        for (int o = 1; o < 8; o <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        __syncwarp();  // every lane of the row has read row_max before lane 0 updates it
        if (sub == 0) {
          const float alpha = exp2f(old_max - new_max);  // 0 on the first page
          sm.row_alpha[row] = alpha;
          sm.row_sum[row] = sm.row_sum[row] * alpha + sum;
          sm.row_max[row] = new_max;
        }
      }
      __syncthreads();

      // ---- O = alpha O + P V: 32 rows x 64 columns per warp, k = 64 tokens
      if constexpr (kMath) {
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          const float a_lo = sm.row_alpha[mt * 16 + lane / 4], a_hi = sm.row_alpha[mt * 16 + lane / 4 + 8];
#pragma unroll
          for (int nt = 0; nt < 8; ++nt) {
            acc[mt][nt][0] *= a_lo;
            acc[mt][nt][1] *= a_lo;
            acc[mt][nt][2] *= a_hi;
            acc[mt][nt][3] *= a_hi;
          }
        }
        const int mat = lane / 8;
#pragma unroll
        for (int ks = 0; ks < kMlaPageTokens / 16; ++ks) {
          std::uint32_t a[2][4];
#pragma unroll
          for (int mt = 0; mt < 2; ++mt)
            device::ldmatrix_x4(a[mt], sm.probs + (mt * 16 + lane % 16) * Cfg::kProbStride + ks * 16 + (lane / 16) * 8);
#pragma unroll
          for (int np = 0; np < 4; ++np) {
            std::uint32_t b[4];
            const int token = ks * 16 + (mat % 2) * 8 + lane % 8;
            const int col = warp * 64 + np * 16 + (mat / 2) * 8;
            device::ldmatrix_x4_trans(b, kv + token * Cfg::kRowStride + col);
#pragma unroll
            for (int mt = 0; mt < 2; ++mt) {
              device::mma_bf16_16816(acc[mt][2 * np], a[mt], b[0], b[1]);
              device::mma_bf16_16816(acc[mt][2 * np + 1], a[mt], b[2], b[3]);
            }
          }
        }
      }
      __syncthreads();  // stage, scores and probs free again

      if (i + Cfg::kStages < num_pages && kVariant != SplitKvVariant::kComputeOnly) {
        const int next = pg + Cfg::kStages;
        load_page<kBulk>(p, next_id, min(token_end - next * kMlaPageTokens, kMlaPageTokens),
                         sm.page + stage * kMlaPageTokens * Cfg::kRowStride, &sm.bars[stage]);
      }
      device::cp_async_commit();
    }
    device::cp_async_wait<0>();  // (cp.async variant) no copy outlives the request
    __syncthreads();

    // ---- epilogue: O / l and the LSE (natural log) of each row, final or partial slot
    const int slot = split_base + split_idx;
    float* o_base = is_split ? p.partial_o + std::int64_t(slot) * p.num_heads * kMlaLatentDim
                             : p.o_lat + std::int64_t(req) * p.num_heads * kMlaLatentDim;
    float* lse_base = is_split ? p.partial_lse + std::int64_t(slot) * p.num_heads : p.lse + std::int64_t(req) * p.num_heads;
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = mt * 16 + lane / 4 + half * 8;
        const int head = group * Cfg::kRows + row;
        if (head >= p.num_heads) continue;
        const float l = sm.row_sum[row];
        const float inv = l > 0.f ? 1.f / l : 0.f;
        float* o_row = o_base + std::int64_t(head) * kMlaLatentDim + warp * 64 + (lane % 4) * 2;
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
          *reinterpret_cast<float2*>(o_row + nt * 8) =
              make_float2(acc[mt][nt][2 * half] * inv, acc[mt][nt][2 * half + 1] * inv);
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
// kFusedCombine: the tiles of a split request merge its partials themselves (fused_combine; needs
// p.counters and all tiles co-resident, which the launcher guarantees).
template <SplitKvVariant kVariant = SplitKvVariant::kCpAsync, bool kFusedCombine = false>
__device__ inline void mla_splitkv_tile(const MlaAttentionParams& p, int tile, char* smem_base) {
  using namespace detail_splitkv;
  // Read once: split-KV itself may OR in kMlaErrorPageId while other tiles run, and the fused
  // tiles must all keep the counter protocol whatever they see.
  const bool flagged = device::step_flagged(p.error_flag);
  if (flagged && !kFusedCombine) return;
  const int groups = head_groups(p.num_heads);
  const int part = tile / groups, group = tile % groups;
  const std::int32_t* meta = p.sched_meta + part * kMlaMetaInts;
  const int begin_req = meta[kMetaBeginReq];
  if (begin_req < 0) return;
  const int end_req = meta[kMetaEndReq];
  const bool first_split = meta[kMetaFirstIsSplit] != 0;
  const bool last_split = meta[kMetaLastIsSplit] != 0 && end_req != begin_req;
  if (flagged) {  // (fused only) arrive for the split requests; nothing is computed or written
    if (first_split) fused_arrive(fused_counter(p, begin_req, group));
    if (last_split) fused_arrive(fused_counter(p, end_req, group));
  } else {
    splitkv_part<kVariant, kFusedCombine>(p, group, meta, smem_base);
  }
  if constexpr (kFusedCombine) {
    // All arrivals of this tile precede its waits, so no tile waits on one that waits on it.
    __syncthreads();  // the page stages are free (every copy of every request was awaited)
    char* stages = reinterpret_cast<char*>(SplitKvSmem(smem_base).page);
    if (first_split) fused_combine(p, begin_req, group, meta[kMetaBeginSplit], !flagged, fused_counter(p, begin_req, group), stages);
    if (last_split) fused_combine(p, end_req, group, 0, !flagged, fused_counter(p, end_req, group), stages);
  }
}

}  // namespace encore::ops::mla
