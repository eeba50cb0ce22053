// fp16 activations in the layout the fp16 tensor-core core of the Q4_K GEMV reads (docs/q4k.md §9.2).
//
// Per token and 256-value block, a power of two 2^s brings the block's largest magnitude into
// [2^14, 2^15): x' = fp16(x * 2^s) cannot overflow, and its only rounding is fp16's (relative
// 2^-11, below the int8 format's amax/254 for every value). Three arrays:
//   values : 512 bytes per (token, block); k step (u, h) of lane t (docs/q4k.md §9.2) reads the
//            8 bytes at f16_value_offset(u, t, h): {x'[p0], x'[p2]}, {x'[p1], x'[p3]} with
//            p_i = f16_position(t, u, h, i), the positions whose codes the lane's weight word holds.
//   sums   : per (block, token) and lane t, the sums S_j / 32 of sub-blocks j = 2t, 2t + 1 as two
//            fp16 pairs, hi = fp16(S / 32) and lo = fp16(S / 32 - hi) (S = the fp32 sum of the
//            block's 32 fp16 values; / 32 keeps it finite; hi + lo carries about 22 bits).
//   scales : per (block, token), 2^-s as fp32.
// ref::quantize_activations_f16 mirrors the values, sums and scales exactly.
#pragma once

#include <cstdint>

#include <cuda_fp16.h>

#include "common/warp.cuh"
#include "q4k/activation_f16_layout.h"

namespace encore::q4k {

namespace detail {

// Lane's part of a block once the block's amax is known: its 8 values scaled by 2^s and rounded to
// fp16 into `values`, and their fp32 sum (the sub-block sum's lane part); returns 2^-s.
__device__ __forceinline__ float store_f16_values(const float (&v)[8], float amax, char* values, float& sum) {
  const int lane = threadIdx.x % 32;
  const int s = f16_scale_exponent((__float_as_int(amax) >> 23) & 0xFF);
  const float up = __int_as_float((127 + s) << 23);
  __half x[8];
  sum = 0.f;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    x[i] = __float2half_rn(v[i] * up);
    sum += __half2float(x[i]);
  }
  // Positions 8 lane + 4w + i, i = 0..3, share one 8-byte group (one word's bytes, one nibble).
#pragma unroll
  for (int w = 0; w < 2; ++w) {
    __align__(8) __half slots[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) slots[f16_value_slot(i)] = x[4 * w + i];
    *reinterpret_cast<uint2*>(values + f16_value_byte_offset(8 * lane + 4 * w)) = *reinterpret_cast<const uint2*>(slots);
  }
  return __int_as_float((127 - s) << 23);
}

// The sub-block's sum (after the 4 lanes' butterfly) as its hi / lo pair, and the block's scale.
__device__ __forceinline__ void store_f16_sums(float sum, float down, char* sums, float* scale) {
  const int lane = threadIdx.x % 32;
  if (lane % 4 == 0) {
    const int j = lane / 4;
    const float scaled = sum * (1.f / 32.f);
    const __half hi = __float2half_rn(scaled), lo = __float2half_rn(scaled - __half2float(hi));
    *reinterpret_cast<__half*>(sums + f16_sum_offset(j, 0)) = hi;
    *reinterpret_cast<__half*>(sums + f16_sum_offset(j, 1)) = lo;
  }
  if (lane == 0) *scale = down;
}

__device__ __forceinline__ float lane_amax(const float (&v)[8]) {
  float amax = 0.f;
#pragma unroll
  for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(v[i]));
  return amax;
}

}  // namespace detail

// Quantises 8 consecutive values v[0..7] at positions 8*lane .. 8*lane+7 of one 256-value block,
// cooperatively with the other 31 lanes: writes the block's 512 value bytes, its lane-t sums
// entries (sums: 4 x 8 bytes) and its scale.
__device__ __forceinline__ void quantize_act_block_f16(const float (&v)[8], char* values, char* sums, float* scale) {
  const float amax = device::warp_max(detail::lane_amax(v));
  float sum;
  const float down = detail::store_f16_values(v, amax, values, sum);
  // Sub-block j = lane / 4: the 4 lanes' sums in a fixed butterfly (the same on every lane).
  sum += __shfl_xor_sync(0xFFFFFFFFu, sum, 1);
  sum += __shfl_xor_sync(0xFFFFFFFFu, sum, 2);
  detail::store_f16_sums(sum, down, sums, scale);
}

// quantize_act_block_f16 for N blocks at once (block u: v[u] into values[u], sums[u], scale[u]),
// each step for all N before the next so that their shuffle chains overlap; a block's arithmetic
// is the same. Blocks with live[u] false (warp-uniform) are skipped.
template <int N>
__device__ __forceinline__ void quantize_act_blocks_f16(const float (&v)[N][8], const bool (&live)[N], char* const (&values)[N],
                                                        char* const (&sums)[N], float* const (&scale)[N]) {
  float amax[N], sum[N], down[N];
#pragma unroll
  for (int u = 0; u < N; ++u) amax[u] = detail::lane_amax(v[u]);
  device::warp_maxes(amax);
#pragma unroll
  for (int u = 0; u < N; ++u) {
    sum[u] = 0.f, down[u] = 0.f;
    if (live[u]) down[u] = detail::store_f16_values(v[u], amax[u], values[u], sum[u]);
  }
#pragma unroll
  for (int m = 1; m <= 2; m <<= 1)
#pragma unroll
    for (int u = 0; u < N; ++u) sum[u] += __shfl_xor_sync(0xFFFFFFFFu, sum[u], m);
#pragma unroll
  for (int u = 0; u < N; ++u)
    if (live[u]) detail::store_f16_sums(sum[u], down[u], sums[u], scale[u]);
}

}  // namespace encore::q4k
