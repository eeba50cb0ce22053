// Device bodies of the small MLA stages: scheduler, cache append, q absorption, combine, V up.
// Every body runs with kBlockThreads threads and takes its shared memory from `smem`.
#pragma once

#include <cmath>
#include <cstdint>

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include <encore/ops/mla.h>

#include "common/body.cuh"
#include "common/block.h"
#include "common/warp.cuh"
#include "common/smem_allocator.cuh"
#include "mla/mla_combine.cuh"
#include "mla/mla_device.cuh"
#include "mla/mla_plan.h"

namespace encore::mla {

// ---- scheduler (one tile) --------------------------------------------------------------------
// Validates the device-resident lengths, positions and page ids, then builds the tape plan of
// mla_plan.h in parallel: a block scan of the request costs, a block scan of the split counts,
// and one independent binary search per part. Thread t owns requests [t per, (t+1) per).
struct SchedSmem {
  using Scan = cub::BlockScan<int, kBlockThreads>;
  int* start;  // [batch + 1]: tape start of each request
  int* flag;
  typename Scan::TempStorage* scan;
  std::size_t bytes;
  __host__ __device__ SchedSmem(char* base, int batch) {
    encore::device::SmemAllocator a(base);
    start = a.take<int>(std::size_t(batch) + 1);
    flag = a.take<int>(1);
    scan = a.take<typename Scan::TempStorage>(1, alignof(typename Scan::TempStorage));
    bytes = a.used();
  }
};
inline std::size_t mla_sched_smem_bytes(int batch) { return SchedSmem(nullptr, batch).bytes; }

__device__ inline void mla_sched_tile(const MlaSchedParams& p, int /*tile*/, char* smem) {
  const SchedSmem sm(smem, p.batch);
  int* start = sm.start;
  int& flag = *sm.flag;
  using Scan = SchedSmem::Scan;
  typename Scan::TempStorage& scan_storage = *sm.scan;
  if (threadIdx.x == 0) flag = 0;
  __syncthreads();
  const int n = p.batch, C = p.fixed_overhead;
  const int capacity = p.cache.max_pages_per_seq * kMlaPageTokens;
  const int per = (n + kBlockThreads - 1) / kBlockThreads;
  const int b0 = min(int(threadIdx.x) * per, n), b1 = min(b0 + per, n);
  int my_flag = 0;
  int my_cost = 0;
  for (int b = b0; b < b1; ++b) {
    const int len = p.seq_lens[b];
    if (len < 0 || len > capacity) my_flag |= kMlaErrorLength;
    const int pos = p.positions != nullptr ? p.positions[b] : len - 1;
    if (len > 0 && pos != len - 1) my_flag |= kMlaErrorPosition;
    // The page the append will write (pages read by attention are checked where they are read).
    if (len > 0 && len <= capacity) {
      const std::int32_t id = p.cache.block_table[std::int64_t(b) * p.cache.block_table_stride + (len - 1) / kMlaPageTokens];
      if (id < 0 || id >= p.cache.num_pages) my_flag |= kMlaErrorPageId;
    }
    start[b] = my_cost;  // local offset; the scan adds the thread's base below
    my_cost += plan_pages(len, capacity) + C;
  }
  if (my_flag) atomicOr(&flag, my_flag);  // integer OR: order-free, deterministic
  int base, total;
  Scan(scan_storage).ExclusiveSum(my_cost, base, total);
  for (int b = b0; b < b1; ++b) start[b] += base;
  if (threadIdx.x == 0) start[n] = total;
  __syncthreads();  // starts complete; also frees the scan storage for the second scan
  const int unit = plan_unit(total, p.num_parts, p.min_part_units);  // the block aggregate reaches every thread
  int my_splits = 0;
  for (int b = b0; b < b1; ++b) my_splits += plan_request_splits(start[b], int(start[b + 1] - start[b] - C), C, unit);
  int split_base;
  Scan(scan_storage).ExclusiveSum(my_splits, split_base);
  if (threadIdx.x == 0) p.num_splits[0] = 0;
  for (int b = b0; b < b1; ++b) {
    split_base += plan_request_splits(start[b], int(start[b + 1] - start[b] - C), C, unit);
    p.num_splits[b + 1] = split_base;
  }
  auto start_of = [&](int b) { return start[b]; };
  for (int part = threadIdx.x; part < p.num_parts; part += kBlockThreads)
    plan_part(part, n, C, unit, start_of, p.part_plans[part]);
  __syncthreads();  // flag complete
  if (threadIdx.x == 0) *p.error_flag = flag;
}

// ---- cache append (tile = request) -------------------------------------------------------------
struct KvAppendSmem {
  using Reduce = cub::BlockReduce<float, kBlockThreads>;
  typename Reduce::TempStorage* reduce;
  float* inv_rms;
  std::size_t bytes;
  __host__ __device__ explicit KvAppendSmem(char* base) {
    encore::device::SmemAllocator a(base);
    reduce = a.take<typename Reduce::TempStorage>(1, alignof(typename Reduce::TempStorage));
    inv_rms = a.take<float>(1);
    bytes = a.used();
  }
};
inline std::size_t mla_kv_append_smem_bytes() { return KvAppendSmem(nullptr).bytes; }

// One request's row. `w`: this thread's two RMSNorm weights (loaded before the body's wait). The
// row's values, the flag, the length and the position load in one round trip and the page id in a
// second beside the norm's reduction; the checks come after both, in one branch (every row of kv_a
// exists, pad rows too, so the reduction may run on any).
__device__ inline void mla_kv_append_tile(const MlaKvAppendParams& p, int tile, char* smem, float2 w) {
  const int req = tile;
  const float* in = p.kv_a + std::int64_t(req) * p.kv_a_stride;
  const float2 c = *reinterpret_cast<const float2*>(in + 2 * threadIdx.x);  // 256 threads x 2 = 512
  float2 pe{};
  if (threadIdx.x < kMlaRopeDim / 2) pe = *reinterpret_cast<const float2*>(in + kMlaLatentDim + 2 * threadIdx.x);
  const bool flagged = step_flagged(p.error_flag);
  const int len = p.seq_lens[req], pos = p.positions[req];
  // Re-checked here so that a body run without a clean scheduler still never writes out of range.
  const bool pos_ok = pos >= 0 && pos < p.cache.max_pages_per_seq * kMlaPageTokens;
  const std::int32_t page_id =
      pos_ok ? p.cache.block_table[std::int64_t(req) * p.cache.block_table_stride + pos / kMlaPageTokens] : -1;

  const KvAppendSmem sm(smem);
  float& inv_rms = *sm.inv_rms;
  const float sumsq = KvAppendSmem::Reduce(*sm.reduce).Sum(c.x * c.x + c.y * c.y);
  if (threadIdx.x == 0) inv_rms = 1.f / sqrtf(sumsq / kMlaLatentDim + p.eps);
  __syncthreads();
  // A flagged step, a pad row, a position or page out of range: nothing written.
  if (flagged | (len <= 0) | (page_id < 0) | (page_id >= p.cache.num_pages)) return;
  __nv_bfloat16* row = p.cache.pages + (std::int64_t(page_id) * kMlaPageTokens + pos % kMlaPageTokens) * kMlaRowDim;
  reinterpret_cast<std::uint32_t*>(row)[threadIdx.x] = pack_bf16x2(c.x * inv_rms * w.x, c.y * inv_rms * w.y);
  if (threadIdx.x < kMlaRopeDim / 2) {
    const int i = threadIdx.x;
    const float2 r = rope_pair(p.rope, pos, i, pe.x, pe.y);
    reinterpret_cast<std::uint32_t*>(row + kMlaLatentDim)[i] = pack_bf16x2(r.x, r.y);
  }
}

// ---- q absorption (tile = (head, 128 latent columns)) --------------------------------------------
struct QAbsorbConfig {
  static constexpr int kCols = 128;       // latent columns per tile
  static constexpr int kGroups = kMlaLatentDim / kCols;
  static constexpr int kTokenChunk = 32;  // tokens staged in shared memory at a time
};
inline std::size_t mla_q_absorb_smem_bytes() {
  return std::size_t(kMlaNopeDim) * QAbsorbConfig::kCols * sizeof(__nv_bfloat16) +
         std::size_t(QAbsorbConfig::kTokenChunk) * kMlaNopeDim * sizeof(float);
}

// The tile's W_UK slice into shared memory: weights, settled before the step, so the body stages
// its first tile's before the wait. The tile's first barrier orders these writes before its reads.
__device__ inline void mla_q_absorb_stage_weights(const MlaQAbsorbParams& p, int tile, char* smem) {
  using Cfg = QAbsorbConfig;
  const int head = tile / Cfg::kGroups, col_group = tile % Cfg::kGroups;
  __nv_bfloat16* w_s = reinterpret_cast<__nv_bfloat16*>(smem);  // [128][128]
  // W_UK[head][i][col_group*128 ...]: rows of 256 bytes.
  const __nv_bfloat16* w_uk = p.kv_b + std::int64_t(head) * kMlaKvbRowsPerHead * kMlaLatentDim + col_group * Cfg::kCols;
  for (int c = threadIdx.x; c < kMlaNopeDim * Cfg::kCols / 8; c += kBlockThreads) {
    const int i = c / (Cfg::kCols / 8), chunk = c % (Cfg::kCols / 8);
    *reinterpret_cast<uint4*>(w_s + i * Cfg::kCols + chunk * 8) =
        *reinterpret_cast<const uint4*>(w_uk + std::int64_t(i) * kMlaLatentDim + chunk * 8);
  }
}

// One tile, its weights staged (mla_q_absorb_stage_weights).
__device__ inline void mla_q_absorb_tile(const MlaQAbsorbParams& p, int tile, char* smem) {
  using Cfg = QAbsorbConfig;
  const int head = tile / Cfg::kGroups, col_group = tile % Cfg::kGroups;
  const __nv_bfloat16* w_s = reinterpret_cast<const __nv_bfloat16*>(smem);                    // [128][128]
  float* q_s = reinterpret_cast<float*>(smem + kMlaNopeDim * Cfg::kCols * sizeof(__nv_bfloat16));  // [chunk][128]
  const int col = threadIdx.x % Cfg::kCols, half = threadIdx.x / Cfg::kCols;
  for (int n0 = 0; n0 < p.batch; n0 += Cfg::kTokenChunk) {
    const int chunk_tokens = min(Cfg::kTokenChunk, p.batch - n0);
    __syncthreads();  // w_s written / previous chunk consumed
    for (int c = threadIdx.x; c < chunk_tokens * kMlaNopeDim / 4; c += kBlockThreads) {
      const int t = c / (kMlaNopeDim / 4), k4 = c % (kMlaNopeDim / 4);
      *reinterpret_cast<float4*>(q_s + t * kMlaNopeDim + 4 * k4) = *reinterpret_cast<const float4*>(
          p.q + std::int64_t(n0 + t) * p.q_stride + std::int64_t(head) * kMlaQHeadDim + 4 * k4);
    }
    __syncthreads();
    // Thread (col, half) computes its half of the chunk's groups of four tokens (both halves busy
    // from 5 tokens), four tokens at a time.
    const int groups = (chunk_tokens + 3) / 4, per_half = (groups + 1) / 2;
    for (int t0 = 4 * half * per_half; t0 < min(chunk_tokens, 4 * (half + 1) * per_half); t0 += 4) {
      float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 8
      for (int i = 0; i < kMlaNopeDim; ++i) {
        const float w = __bfloat162float(w_s[i * Cfg::kCols + col]);
#pragma unroll
        for (int u = 0; u < 4; ++u) acc[u] += q_s[min(t0 + u, Cfg::kTokenChunk - 1) * kMlaNopeDim + i] * w;
      }
#pragma unroll
      for (int u = 0; u < 4; ++u)
        if (t0 + u < chunk_tokens)
          p.q576[(std::int64_t(n0 + t0 + u) * p.num_heads + head) * kMlaRowDim + col_group * Cfg::kCols + col] =
              __float2bfloat16_rn(acc[u]);
    }
  }
  // The rope part of every token: by the tiles of column group 0.
  if (col_group == 0) {
    for (int c = threadIdx.x; c < p.batch * (kMlaRopeDim / 2); c += kBlockThreads) {
      const int n = c / (kMlaRopeDim / 2), i = c % (kMlaRopeDim / 2);
      const float* q_pe = p.q + std::int64_t(n) * p.q_stride + std::int64_t(head) * kMlaQHeadDim + kMlaNopeDim;
      const float2 r = rope_pair(p.rope, p.positions[n], i, q_pe[2 * i], q_pe[2 * i + 1]);
      reinterpret_cast<std::uint32_t*>(p.q576 + (std::int64_t(n) * p.num_heads + head) * kMlaRowDim + kMlaLatentDim)[i] =
          pack_bf16x2(r.x, r.y);
    }
  }
}

// ---- combine (tile = (request, head, column slice)) --------------------------------------------
// Few requests (many splits each): 4 slices of 128 columns per row, so more blocks share the
// reads. Many requests (few splits each): one slice of 512 columns, so fewer, fuller tiles.
// The math is mla_combine.cuh's, shared with the combine fused into split-KV.
struct CombineConfig {
  __host__ __device__ static int slices(int batch) { return batch >= 8 ? 1 : 4; }
};
inline std::size_t mla_combine_smem_bytes(int num_parts) {
  return kCombineRedBytes + (std::size_t(num_parts) + 1) * sizeof(float);
}

__device__ inline void mla_combine_tile(const MlaAttentionParams& p, int tile, char* smem) {
  if (step_flagged(p.error_flag)) return;
  const int slices = CombineConfig::slices(p.batch);
  const int slice = tile % slices;
  const int head = (tile / slices) % p.num_heads;
  const int req = tile / slices / p.num_heads;
  const int first = p.num_splits[req];
  const int splits = p.num_splits[req + 1] - first;
  if (splits <= 1) return;  // written final by the split-KV tile
  float4* red = reinterpret_cast<float4*>(smem);
  float* weight = reinterpret_cast<float*>(smem + kCombineRedBytes);  // [splits]
  if (threadIdx.x < 32) {
    const float lse = combine_weights_warp(p.partial_lse + std::int64_t(first) * p.num_heads + head, p.num_heads, splits, weight);
    if (slice == 0 && threadIdx.x == 0) p.lse[std::int64_t(req) * p.num_heads + head] = lse;
  }
  __syncthreads();
  const int per_slice = kFloat4PerRow / slices;
  const int begin = head * kFloat4PerRow + slice * per_slice;
  combine_items(p, req, splits, begin, begin + per_slice, weight, head, red, PartialsInGlobal(p, first));  // ends with a barrier
}

// ---- V up-projection (tile = (head, 32 output rows)) ---------------------------------------------
struct VUpConfig {
  static constexpr int kRows = 32;
  static constexpr int kGroups = kMlaVHeadDim / kRows;
  static constexpr int kRowsPerWarp = kRows / kWarpsPerBlock;  // 4
  static_assert(kRowsPerWarp == 4, "a warp's rows are stored as one float4 a token");
};

// Tokens a V up-projection round takes: 4 from two tokens, 1 at one token (no code for absent
// tokens where batch 1 runs alone: the megakernel's one-token tier and the launcher at batch 1).
constexpr int v_up_tokens_per_round(int batch) { return batch == 1 ? 1 : 4; }

// The tile loads its weights, then calls wait() (o_lat comes from the combine).
template <int kTok, class Wait>
__device__ inline void mla_v_up_tile(const MlaVUpParams& p, int tile, Wait& wait) {
  using Cfg = VUpConfig;
  const int head = tile / Cfg::kGroups, group = tile % Cfg::kGroups;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row0 = group * Cfg::kRows + warp * Cfg::kRowsPerWarp;
  // Lane holds columns lane*8..+7 and 256+lane*8..+7 of its warp's 4 rows of W_UV[head].
  uint4 w[Cfg::kRowsPerWarp][2];
  const __nv_bfloat16* w_uv = p.kv_b + (std::int64_t(head) * kMlaKvbRowsPerHead + kMlaNopeDim + row0) * kMlaLatentDim;
#pragma unroll
  for (int r = 0; r < Cfg::kRowsPerWarp; ++r)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      w[r][h] = *reinterpret_cast<const uint4*>(w_uv + std::int64_t(r) * kMlaLatentDim + h * 256 + lane * 8);
  wait();
  // kTok tokens a round: their o_lat loads in flight together, their 4 x kTok row sums' shuffles
  // interleaved (each sum's order is warp_sum's, whatever the batch or kTok).
  for (int n0 = 0; n0 < p.batch; n0 += kTok) {
    float x[kTok][2][8];
#pragma unroll
    for (int u = 0; u < kTok; ++u) {
      const int n = min(n0 + u, p.batch - 1);  // (past the batch: the last token again, not stored)
      const float* o = p.o_lat + (std::int64_t(n) * p.num_heads + head) * kMlaLatentDim;
#pragma unroll
      for (int h = 0; h < 2; ++h) device::load_float8(o + h * 256 + lane * 8, x[u][h]);
    }
    float dot[kTok * Cfg::kRowsPerWarp];
#pragma unroll
    for (int u = 0; u < kTok; ++u)
#pragma unroll
      for (int r = 0; r < Cfg::kRowsPerWarp; ++r) {
        float& d = dot[u * Cfg::kRowsPerWarp + r];
        d = 0.f;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const __nv_bfloat162* wv = reinterpret_cast<const __nv_bfloat162*>(&w[r][h]);
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float2 f = __bfloat1622float2(wv[e]);
            d += f.x * x[u][h][2 * e] + f.y * x[u][h][2 * e + 1];
          }
        }
      }
    device::warp_sums(dot);
#pragma unroll
    for (int u = 0; u < kTok; ++u)
      if (lane == 0 && n0 + u < p.batch)
        *reinterpret_cast<float4*>(p.out + std::int64_t(n0 + u) * p.num_heads * kMlaVHeadDim + head * kMlaVHeadDim + row0) =
            make_float4(dot[4 * u], dot[4 * u + 1], dot[4 * u + 2], dot[4 * u + 3]);  // (kRowsPerWarp == 4)
  }
}

// ---- bodies (common/body.cuh) --------------------------------------------------------------------
// The small stages read nothing before their wait but v_up, whose weights go to registers first.
template <class Range, class Wait>
__device__ inline void mla_sched_body(const MlaSchedParams& p, const Range& r, char* smem, Wait& wait) {
  wait();
  if (r.first() == 0) mla_sched_tile(p, 0, smem);
}

template <class Range, class Wait>
__device__ inline void mla_kv_append_body(const MlaKvAppendParams& p, const Range& r, char* smem, Wait& wait) {
  const float2 w = *reinterpret_cast<const float2*>(p.norm_weight + 2 * threadIdx.x);  // a weight: before the wait
  wait();
  for (int tile = r.first(); tile < p.batch; tile += r.stride()) {
    mla_kv_append_tile(p, tile, smem, w);
    __syncthreads();
  }
}

template <class Range, class Wait>
__device__ inline void mla_q_absorb_body(const MlaQAbsorbParams& p, const Range& r, char* smem, Wait& wait) {
  const int tiles = p.num_heads * QAbsorbConfig::kGroups;
  for (int tile = r.first(); tile < tiles; tile += r.stride()) {
    mla_q_absorb_stage_weights(p, tile, smem);  // (the first tile's before the wait; later calls return at once)
    wait();
    mla_q_absorb_tile(p, tile, smem);
    __syncthreads();
  }
  wait();  // (a block without a tile)
}

template <class Range, class Wait>
__device__ inline void mla_combine_body(const MlaAttentionParams& p, const Range& r, char* smem, Wait& wait) {
  wait();
  const int tiles = p.batch * p.num_heads * CombineConfig::slices(p.batch);
  for (int tile = r.first(); tile < tiles; tile += r.stride()) mla_combine_tile(p, tile, smem);
}

template <int kTok, class Range, class Wait>
__device__ inline void mla_v_up_body(const MlaVUpParams& p, const Range& r, Wait& wait) {
  const int tiles = p.num_heads * VUpConfig::kGroups;
  for (int tile = r.first(); tile < tiles; tile += r.stride()) mla_v_up_tile<kTok>(p, tile, wait);
}

}  // namespace encore::mla
