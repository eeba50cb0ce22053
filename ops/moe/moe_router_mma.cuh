// Tensor-core form of the router GEMV tile, for bf16 weights and two tokens or more (docs/moe.md §2).
// One tile is the FMA form's (8 experts, one K slice): the experts are the n of
// mma.sync.m16n8k8 (tf32), 16 tokens its m, and warp w takes values w*32 .. w*32+31 of every K block
// of the slice, so each activation is loaded once per tile (the FMA form's eight warps each load
// all of them, one expert per warp). h (times gamma with a fused RMSNorm) enters as two tf32 parts,
// big + small, which leave h's value to 2^-22 of it; bf16 weights are tf32 values already. The
// products accumulate in fp32, and the warps' sums are added in warp order through shared memory,
// so a token's logits are the same bits in every batch of two or more.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>

#include "common/block.h"
#include "moe/moe_router_params.cuh"

namespace encore::moe {

// K values a lane holds per 16 of a warp's 32 in a K block: physical k = 16q + 4t + {0, 1, 2, 3}
// (t = lane % 4) feed mma step 2q's k slots (t, t + 4) with the first pair and step 2q + 1's with
// the second; A and B use the same map, so the sum covers every k once.
inline constexpr int kRouterMmaKGroups = 2;  // groups of 16 values in a warp's 32
inline constexpr int kRouterMmaTokens = 16;  // tokens per round (the mma's m)

// The tile's weights in a lane: expert (lane / 4) of the tile, 4 values per (K block, group),
// as tf32 bit patterns (a bf16's bits shifted up: exact). Zero for an expert past E.
using RouterMmaWeights = std::uint32_t[kRouterSliceBlocks][kRouterMmaKGroups][4];

// Shared memory: each warp's 16 x 8 sums and 16 sums of squares, added in warp order.
inline constexpr std::size_t kRouterMmaSmemBytes = std::size_t(kWarpsPerBlock) * (kRouterMmaTokens * kRouterRowsPerTile + kRouterMmaTokens) * 4;

// Which form runs: the tensor-core form for bf16 weights from two tokens (the FMA form keeps one
// token and fp32 weights). Both paths (graph, megakernel) ask this of the same parameters.
__host__ __device__ inline bool router_gemv_uses_mma(const RouterGemvParams& p) { return p.weight_bf16 && p.batch >= 2; }
__host__ __device__ inline std::size_t router_gemv_smem_bytes(const RouterGemvParams& p) {
  return router_gemv_uses_mma(p) ? kRouterMmaSmemBytes : 0;
}

// The first of the calling lane's 4 K values in group `group` of K block `block`.
__device__ __forceinline__ int router_mma_k(int block, int group) {
  const int warp = threadIdx.x / 32, t = threadIdx.x % 4;
  return block * 256 + warp * 32 + group * 16 + t * 4;
}

// The lane's weights of `tile` (settled: the bodies load them before their wait).
__device__ inline void load_router_tile_mma(const RouterGemvParams& p, int tile, RouterMmaWeights& w) {
  const int expert = (tile / p.slices) * kRouterRowsPerTile + (threadIdx.x % 32) / 4;
  const int kb0 = (tile % p.slices) * kRouterSliceBlocks;
  const int nb = min(kRouterSliceBlocks, p.hidden_blocks - kb0);
  const auto* row = static_cast<const __nv_bfloat16*>(p.weight) + std::int64_t(expert) * p.hidden_blocks * 256;
#pragma unroll
  for (int b = 0; b < kRouterSliceBlocks; ++b)
#pragma unroll
    for (int q = 0; q < kRouterMmaKGroups; ++q) {
      uint2 raw = make_uint2(0u, 0u);
      if (b < nb && expert < p.num_experts) raw = __ldg(reinterpret_cast<const uint2*>(row + router_mma_k(kb0 + b, q)));
      w[b][q][0] = raw.x << 16, w[b][q][1] = raw.x & 0xFFFF0000u;
      w[b][q][2] = raw.y << 16, w[b][q][3] = raw.y & 0xFFFF0000u;
    }
}

__device__ __forceinline__ std::uint32_t to_tf32(float x) {
  std::uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
}
// c += A (16 x 8, tf32, row-major) * B (8 x 8, tf32, column-major), fp32 accumulators.
__device__ __forceinline__ void mma_tf32_1688(float (&c)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// c += (big + small parts of A) * B. A's registers: (row g, slot t), (g + 8, t), (g, t + 4), (g + 8, t + 4).
__device__ __forceinline__ void mma_split_a(float (&c)[4], const float (&a)[4], std::uint32_t b0, std::uint32_t b1) {
  std::uint32_t big[4], small[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    big[i] = to_tf32(a[i]);
    small[i] = to_tf32(a[i] - __uint_as_float(big[i]));
  }
  mma_tf32_1688(c, small, b0, b1);
  mma_tf32_1688(c, big, b0, b1);
}

// One tile with its weights `w` (load_router_tile_mma); every warp of the block runs it (two
// barriers a round of 16 tokens). `smem`: kRouterMmaSmemBytes.
__device__ inline void router_gemv_tile_mma(const RouterGemvParams& p, int tile, const RouterMmaWeights& w, char* smem) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int expert0 = (tile / p.slices) * kRouterRowsPerTile, slice = tile % p.slices;
  const int kb0 = slice * kRouterSliceBlocks;
  const int nb = min(kRouterSliceBlocks, p.hidden_blocks - kb0);
  const std::int64_t hidden = std::int64_t(p.hidden_blocks) * 256;
  const bool sums = p.gamma && expert0 == 0;  // the slice's sum of h^2, from the tiles of experts 0..7
  float* red = reinterpret_cast<float*>(smem);                       // [warp][16 tokens][8 experts]
  float* red_sq = red + kWarpsPerBlock * kRouterMmaTokens * kRouterRowsPerTile;  // [warp][16 tokens]

  for (int t0 = 0; t0 < p.batch; t0 += kRouterMmaTokens) {
    const int rows[2] = {t0 + g, t0 + g + 8};
    // Every load of the round before the first mma. h may have been written earlier in the same
    // launch (the megakernel): coherent loads.
    float4 x[kRouterSliceBlocks][kRouterMmaKGroups][2];
#pragma unroll
    for (int b = 0; b < kRouterSliceBlocks; ++b)
#pragma unroll
      for (int q = 0; q < kRouterMmaKGroups; ++q)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          x[b][q][r] = make_float4(0.f, 0.f, 0.f, 0.f);
          if (b < nb && rows[r] < p.batch) x[b][q][r] = *reinterpret_cast<const float4*>(p.h + rows[r] * hidden + router_mma_k(kb0 + b, q));
        }
    float acc[4] = {0.f, 0.f, 0.f, 0.f}, sq[2] = {0.f, 0.f};
#pragma unroll
    for (int b = 0; b < kRouterSliceBlocks; ++b)
#pragma unroll
      for (int q = 0; q < kRouterMmaKGroups; ++q) {
        if (b >= nb) break;
        float v[2][4] = {{x[b][q][0].x, x[b][q][0].y, x[b][q][0].z, x[b][q][0].w},
                         {x[b][q][1].x, x[b][q][1].y, x[b][q][1].z, x[b][q][1].w}};
        if (sums)
#pragma unroll
          for (int r = 0; r < 2; ++r)
#pragma unroll
            for (int i = 0; i < 4; ++i) sq[r] = fmaf(v[r][i], v[r][i], sq[r]);
        if (p.gamma) {
          const float4 gm = __ldg(reinterpret_cast<const float4*>(p.gamma + router_mma_k(kb0 + b, q)));
#pragma unroll
          for (int r = 0; r < 2; ++r) v[r][0] *= gm.x, v[r][1] *= gm.y, v[r][2] *= gm.z, v[r][3] *= gm.w;
        }
#pragma unroll
        for (int j = 0; j < 2; ++j) {  // step 2q + j: slots (t, t + 4) <- values (2j, 2j + 1)
          const float a[4] = {v[0][2 * j], v[1][2 * j], v[0][2 * j + 1], v[1][2 * j + 1]};
          mma_split_a(acc, a, w[b][q][2 * j], w[b][q][2 * j + 1]);
        }
      }
    // acc: (token g, experts 2t, 2t + 1), (token g + 8, the same experts).
    float* mine = red + warp * kRouterMmaTokens * kRouterRowsPerTile;
    *reinterpret_cast<float2*>(mine + g * kRouterRowsPerTile + 2 * t) = make_float2(acc[0], acc[1]);
    *reinterpret_cast<float2*>(mine + (g + 8) * kRouterRowsPerTile + 2 * t) = make_float2(acc[2], acc[3]);
    if (sums) {
#pragma unroll
      for (int r = 0; r < 2; ++r) sq[r] += __shfl_xor_sync(0xFFFFFFFFu, sq[r], 1), sq[r] += __shfl_xor_sync(0xFFFFFFFFu, sq[r], 2);
      if (t == 0) red_sq[warp * kRouterMmaTokens + g] = sq[0], red_sq[warp * kRouterMmaTokens + g + 8] = sq[1];
    }
    __syncthreads();
    const int tid = threadIdx.x;
    if (tid < kRouterMmaTokens * kRouterRowsPerTile) {
      const int token = t0 + tid / kRouterRowsPerTile, expert = expert0 + tid % kRouterRowsPerTile;
      float s = 0.f;
#pragma unroll
      for (int u = 0; u < kWarpsPerBlock; ++u) s += red[u * kRouterMmaTokens * kRouterRowsPerTile + tid];
      if (token < p.batch && expert < p.num_experts) p.partial[(std::int64_t(slice) * p.batch + token) * p.num_experts + expert] = s;
    } else if (sums && tid < kRouterMmaTokens * kRouterRowsPerTile + kRouterMmaTokens) {
      const int row = tid - kRouterMmaTokens * kRouterRowsPerTile, token = t0 + row;
      float s = 0.f;
#pragma unroll
      for (int u = 0; u < kWarpsPerBlock; ++u) s += red_sq[u * kRouterMmaTokens + row];
      if (token < p.batch) p.sum_squares[std::int64_t(slice) * p.batch + token] = s;
    }
    __syncthreads();  // the next round (or the caller) may write the shared memory again
  }
}

}  // namespace encore::moe
