// The LSE merge of split-KV partials (docs/mla.md §9), written once for every caller: the standalone
// combine tile (mla_tiles.cuh) and the two combines fused into the split-KV kernel
// (mla_fused_combine.cuh: a slice per part, or a two-split request in its first split's
// epilogue). All run the same per-element order, so their outputs are bit-identical:
//   weights: one warp per (request, head): m = max lse_i (0 if all -inf), L = sum exp(lse_i - m)
//            (lane-strided, then a fixed shuffle tree), lse = m + log L (+inf if L = 0),
//            w_i = exp(lse_i - lse);
//   output:  bucket b of nb = combine_buckets(splits) sums w_i o_i over splits i = b, b + nb, ...
//            in index order (fma), then the buckets are added in order 0..nb-1.
// nb depends only on the split count, never on the caller's tiling. The standalone tile reads the
// partials from global memory as it goes; the fused combine first stages its slice of them in
// shared memory with one round of copies, and the pair merge reads its own split from its output
// rows in shared memory. All run combine_items.
// Partials are read through L2 (ld.cg, cp.async.cg): in the fused kernel other SMs wrote them in
// this grid.
#pragma once

#include <cmath>
#include <cstdint>

#include <encore/ops/mla.h>

#include "common/block.h"
#include "common/warp.cuh"
#include "mla/mla_device.cuh"

namespace encore::mla {

inline constexpr int kFloat4PerRow = kMlaLatentDim / 4;  // 128 float4 per (request, head) row
inline constexpr int kCombineItemsPerThread = 4;           // float4 items per thread and pass

// Buckets (partial sums per output element): the largest power of two <= min(splits, 32), so
// many splits spread over many threads and few splits still keep every thread busy.
__host__ __device__ inline int combine_buckets(int splits) {
  int nb = 1;
  while (nb * 2 <= splits && nb < 32) nb *= 2;
  return nb;
}

// Shared memory of combine_items: one float4 per thread and item.
inline constexpr std::size_t kCombineRedBytes = std::size_t(kBlockThreads) * 16 * kCombineItemsPerThread;

// One warp: weights of `splits` partials from their LSEs, already in weight[0..splits) (shared
// memory, visible to the warp), written over them in place; returns the row's LSE (every lane).
__device__ inline float combine_weights_from_lse(int splits, float* weight) {
  const int lane = threadIdx.x % 32;
  float m = -INFINITY;
  for (int i = lane; i < splits; i += 32) m = fmaxf(m, weight[i]);
  m = device::warp_max(m);
  if (m == -INFINITY) m = 0.f;
  float sum = 0.f;
  for (int i = lane; i < splits; i += 32) sum += expf(weight[i] - m);
  sum = device::warp_sum(sum);
  const float lse = sum > 0.f ? m + logf(sum) : INFINITY;
  for (int i = lane; i < splits; i += 32) weight[i] = sum > 0.f ? expf(weight[i] - lse) : 0.f;  // own i only
  __syncwarp();
  return lse;
}

// One warp: weights of the `splits` partials of one (request, head) row into weight[0..splits),
// returns the row's LSE (every lane). plse points at partial_lse[first slot][head]; stride = heads.
// The LSEs are read once (one trip to L2) into weight[], then reduced from shared memory.
__device__ inline float combine_weights_warp(const float* plse, int stride, int splits, float* weight) {
  const int lane = threadIdx.x % 32;
  for (int i = lane; i < splits; i += 32) weight[i] = __ldcg(plse + std::int64_t(i) * stride);
  __syncwarp();
  return combine_weights_from_lse(splits, weight);
}

// Where combine_items reads split i's float4 `item` of a request: the partials in global memory
// (slots first .. first + splits - 1), read through L2.
struct PartialsInGlobal {
  const float4* first_slot;
  std::int64_t slot_stride;  // float4 per slot
  __device__ PartialsInGlobal(const MlaAttentionParams& p, int first)
      : first_slot(reinterpret_cast<const float4*>(p.partial_o) + std::int64_t(first) * p.num_heads * kFloat4PerRow),
        slot_stride(std::int64_t(p.num_heads) * kFloat4PerRow) {}
  __device__ float4 operator()(int i, int item) const { return __ldcg(first_slot + i * slot_stride + item); }
};

// ... or copies of items [begin, begin + n) staged in shared memory, split-major.
struct PartialsStaged {
  const float4* staged;  // [splits][n]
  int begin, n;
  __device__ float4 operator()(int i, int item) const { return staged[i * n + item - begin]; }
};

// All threads: o_lat float4 items [begin, end) of request `req` (item = head * 128 + float4 of
// the head's row) from its `splits` partials, read by `load(i, item)`. The weight of split i for
// head h is weight[(h - weight_head0) * splits + i] (shared memory, complete on entry).
// Thread (bucket, j) handles kCombineItemsPerThread items per pass and issues their loads
// together (from global memory the chain is L2 latency, not bytes). `red`: kCombineRedBytes.
// Ends with a barrier.
template <class LoadPartial>
__device__ inline void combine_items(const MlaAttentionParams& p, int req, int splits, int begin, int end, const float* weight,
                                     int weight_head0, float4* red, const LoadPartial& load) {
  constexpr int K = kCombineItemsPerThread;
  const int nb = combine_buckets(splits), per_pass = kBlockThreads / nb;
  const int bucket = threadIdx.x / per_pass, j = threadIdx.x % per_pass;
  float4* out = reinterpret_cast<float4*>(p.o_lat) + std::int64_t(req) * p.num_heads * kFloat4PerRow;
  for (int base = begin; base < end; base += per_pass * K) {
    int item[K];
    const float* w[K];
    float4 acc[K];
#pragma unroll
    for (int k = 0; k < K; ++k) {
      item[k] = base + k * per_pass + j;
      w[k] = weight + (min(item[k], end - 1) / kFloat4PerRow - weight_head0) * splits;
      acc[k] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll 2
    for (int i = bucket; i < splits; i += nb) {
      float4 x[K];
#pragma unroll
      for (int k = 0; k < K; ++k) x[k] = item[k] < end ? load(i, item[k]) : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
      for (int k = 0; k < K; ++k) {
        const float wi = w[k][i];
        acc[k].x = fmaf(wi, x[k].x, acc[k].x);
        acc[k].y = fmaf(wi, x[k].y, acc[k].y);
        acc[k].z = fmaf(wi, x[k].z, acc[k].z);
        acc[k].w = fmaf(wi, x[k].w, acc[k].w);
      }
    }
#pragma unroll
    for (int k = 0; k < K; ++k) red[k * kBlockThreads + threadIdx.x] = acc[k];
    __syncthreads();
    // Item base + t (t = k per_pass + j): its buckets added in order.
    for (int t = threadIdx.x; t < per_pass * K && base + t < end; t += kBlockThreads) {
      const float4* r = red + (t / per_pass) * kBlockThreads + t % per_pass;
      float4 total = r[0];
      for (int b = 1; b < nb; ++b) {
        const float4 x = r[b * per_pass];
        total.x += x.x;
        total.y += x.y;
        total.z += x.z;
        total.w += x.w;
      }
      out[base + t] = total;
    }
    __syncthreads();
  }
}

}  // namespace encore::mla
