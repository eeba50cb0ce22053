// Device bodies of the two pipeline stages no op provides: the embedding gather and a plain
// RMSNorm (the MoE input h). One tile = one token row, 256 threads; both are trivially memory-bound
// and short, so they favour latency: one pass, float4 accesses, one CUB block reduction.
#pragma once

#include <cub/block/block_reduce.cuh>

#include <cuda_bf16.h>

#include <encore/pipeline/stage_params.h>

#include "common/launch.cuh"

namespace encore::pipeline::device {

// x[row] = float(table[id]); ids outside [0, vocab) are clamped (the host checks them before a
// step; the clamp only keeps a bad id from reading outside the table).
__device__ inline void embed_tile(const EmbedParams& p, int row) {
  int id = p.token_ids[row];
  id = id < 0 ? 0 : (id >= p.vocab ? p.vocab - 1 : id);
  const uint2* src = reinterpret_cast<const uint2*>(p.table + std::int64_t(id) * p.hidden);  // 4 bf16
  float4* dst = reinterpret_cast<float4*>(p.x + std::int64_t(row) * p.hidden);
  for (int i = threadIdx.x; i < p.hidden / 4; i += kBlockThreads) {
    const uint2 v = src[i];
    const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&v.x));
    const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&v.y));
    dst[i] = make_float4(a.x, a.y, b.x, b.y);
  }
}

// out[row] = x[row] * (mean(x[row]^2) + eps)^-1/2 * gamma. Each thread sums its float4s in a fixed
// order and CUB reduces the block in a fixed tree, so the result is deterministic.
__device__ inline void rmsnorm_tile(const RmsNormParams& p, int row) {
  using Reduce = cub::BlockReduce<float, kBlockThreads>;
  __shared__ typename Reduce::TempStorage temp;
  __shared__ float inv_rms;
  const float4* x = reinterpret_cast<const float4*>(p.x + std::int64_t(row) * p.k);
  const int vecs = int(p.k / 4);
  float ss = 0.f;
  for (int i = threadIdx.x; i < vecs; i += kBlockThreads) {
    const float4 v = x[i];
    ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
  }
  const float total = Reduce(temp).Sum(ss);
  if (threadIdx.x == 0) inv_rms = rsqrtf(total / float(p.k) + p.eps);
  __syncthreads();
  const float s = inv_rms;
  const float4* g = reinterpret_cast<const float4*>(p.gamma);
  float4* out = reinterpret_cast<float4*>(p.out + std::int64_t(row) * p.k);
  for (int i = threadIdx.x; i < vecs; i += kBlockThreads) {
    const float4 v = x[i], w = g[i];
    out[i] = make_float4(v.x * s * w.x, v.y * s * w.y, v.z * s * w.z, v.w * s * w.w);
  }
  __syncthreads();  // temp and inv_rms are reused by the block's next tile
}

}  // namespace encore::pipeline::device
