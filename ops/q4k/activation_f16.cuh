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

#include "q4k/activation_f16_layout.h"

namespace encore::q4k {

// Quantises 8 consecutive values v[0..7] at positions 8*lane .. 8*lane+7 of one 256-value block,
// cooperatively with the other 31 lanes: writes the block's 512 value bytes, its lane-t sums
// entries (sums: 4 x 8 bytes) and its scale.
__device__ __forceinline__ void quantize_act_block_f16(const float (&v)[8], char* values, char* sums, float* scale) {
  const int lane = threadIdx.x % 32;
  float amax = 0.f;
#pragma unroll
  for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(v[i]));
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, m));
  const int s = f16_scale_exponent((__float_as_int(amax) >> 23) & 0xFF);
  const float up = __int_as_float((127 + s) << 23), down = __int_as_float((127 - s) << 23);

  __half x[8];
  float sum = 0.f;
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
  // Sub-block j = lane / 4: the 4 lanes' sums in a fixed butterfly (the same on every lane).
  sum += __shfl_xor_sync(0xFFFFFFFFu, sum, 1);
  sum += __shfl_xor_sync(0xFFFFFFFFu, sum, 2);
  if (lane % 4 == 0) {
    const int j = lane / 4;
    const float scaled = sum * (1.f / 32.f);
    const __half hi = __float2half_rn(scaled), lo = __float2half_rn(scaled - __half2float(hi));
    *reinterpret_cast<__half*>(sums + f16_sum_offset(j, 0)) = hi;
    *reinterpret_cast<__half*>(sums + f16_sum_offset(j, 1)) = lo;
  }
  if (lane == 0) *scale = down;
}

}  // namespace encore::q4k
