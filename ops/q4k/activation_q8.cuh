// int8 activations in the layout the Q4_K dot product wants (docs/q4k.md §8 item 3).
// Per 256-value block and token: 256 int8 codes + eight float4 "meta" = 384 bytes.
//   codes[0..127]   : the "lo" halves: lane c's 16 codes of sub-block 2*(c/2), positions 16*(c%2)..+15
//   codes[128..255] : the "hi" halves: the same positions of sub-block 2*(c/2)+1
//   meta[c]         : {d_lo, d_hi, sum_lo, sum_hi}: the int8 scales (amax/127) of the two sub-blocks
//                     and the fp32 sums of the 16 *unquantised* values lane c covers in each.
// Lane c of an 8-lane group reads codes c*16 and 128 + c*16 and meta[c]: 8 lanes touch 128
// contiguous bytes per load, so shared-memory reads are conflict-free.
#pragma once

#include <cstdint>

#include "common/warp.cuh"

namespace encore::q4k {

inline constexpr int kActBlockBytes = 384;  // per 256 values per token

struct ActBlockView {
  const std::int8_t* codes;  // 256
  const float4* meta;        // 8
};

__device__ __forceinline__ ActBlockView act_block(const char* base) {
  return {reinterpret_cast<const std::int8_t*>(base), reinterpret_cast<const float4*>(base + 256)};
}

namespace detail {

// Lane's 8 values' amax and sum.
__device__ __forceinline__ void lane_amax_sum(const float (&v)[8], float& amax, float& sum) {
  amax = 0.f, sum = 0.f;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    amax = fmaxf(amax, fabsf(v[i]));
    sum += v[i];
  }
}

// Lane's codes and meta entries once its sub-block's amax and its partner lane's sum are known.
__device__ __forceinline__ void store_act_lane(const float (&v)[8], float amax, float sum, float partner_sum, char* out) {
  const int lane = threadIdx.x % 32;
  const float half_sum = (lane & 1) ? partner_sum + sum : sum + partner_sum;  // lower lane's part first
  const float inv = amax > 0.f ? 127.f / amax : 0.f;
  const float d = amax / 127.f;

  std::uint32_t packed[2] = {0u, 0u};
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int q = __float2int_rn(v[i] * inv);
    packed[i / 4] |= (std::uint32_t(q) & 0xFFu) << (8 * (i % 4));
  }
  const int sub_block = lane / 4;          // 0..7
  const int pos = (lane % 4) * 8;          // first position inside the sub-block
  const int chunk = 2 * (sub_block / 2) + pos / 16;
  const int half = sub_block % 2;          // 0: lo, 1: hi
  *reinterpret_cast<uint2*>(out + half * 128 + chunk * 16 + pos % 16) = make_uint2(packed[0], packed[1]);
  float* meta = reinterpret_cast<float*>(out + 256);
  if ((lane & 1) == 0) meta[chunk * 4 + 2 + half] = half_sum;
  if ((lane & 3) == 0) {  // the scale serves both chunks of this sub-block
    meta[(2 * (sub_block / 2)) * 4 + half] = d;
    meta[(2 * (sub_block / 2) + 1) * 4 + half] = d;
  }
}

}  // namespace detail

// Quantises 8 consecutive values v[0..7] at positions 8*lane .. 8*lane+7 of one 256-value block,
// cooperatively with the other 31 lanes of the warp, into `out` (kActBlockBytes). Rounding: codes
// round half to even of v * (127 / amax); d = amax / 127; amax = 0 gives codes 0 and d = 0.
// ref::quantize_activations mirrors this exactly.
__device__ __forceinline__ void quantize_act_block(const float (&v)[8], char* out) {
  float amax, sum;
  detail::lane_amax_sum(v, amax, sum);
  // 4 lanes form a 32-value sub-block, 2 lanes a 16-value half.
  amax = device::warp_max<4>(amax);
  const float partner_sum = __shfl_xor_sync(0xFFFFFFFFu, sum, 1);
  detail::store_act_lane(v, amax, sum, partner_sum, out);
}

// quantize_act_block for N blocks at once (block u: v[u] into out[u]), each step for all N before
// the next so that their shuffle chains overlap; a block's arithmetic is the same. Blocks with
// live[u] false (warp-uniform) are skipped.
template <int N>
__device__ __forceinline__ void quantize_act_blocks(const float (&v)[N][8], const bool (&live)[N], char* const (&out)[N]) {
  float amax[N], sum[N], partner_sum[N];
#pragma unroll
  for (int u = 0; u < N; ++u) detail::lane_amax_sum(v[u], amax[u], sum[u]);
  device::warp_maxes<N, 4>(amax);  // (the sub-block's 4 lanes)
#pragma unroll
  for (int u = 0; u < N; ++u) partner_sum[u] = __shfl_xor_sync(0xFFFFFFFFu, sum[u], 1);
#pragma unroll
  for (int u = 0; u < N; ++u)
    if (live[u]) detail::store_act_lane(v[u], amax[u], sum[u], partner_sum[u], out[u]);
}

}  // namespace encore::q4k
