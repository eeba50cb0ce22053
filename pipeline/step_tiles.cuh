// Device body of the one pipeline stage no op provides: the embedding gather. One tile = one token
// row, 256 threads, float4 stores.
#pragma once

#include <cuda_bf16.h>

#include <encore/pipeline/stage_params.h>

#include "common/body.cuh"
#include "common/block.h"

namespace encore::pipeline {

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

// The embed body (common/body.cuh): token ids may come from an upstream kernel.
template <class Range, class Wait>
__device__ inline void embed_body(const EmbedParams& p, const Range& r, Wait& wait) {
  wait();
  for (int row = r.first(); row < p.batch; row += r.stride()) embed_tile(p, row);
}

}  // namespace encore::pipeline
