// The inner product of one Q4_K block with int8 activations, as one lane of an 8-lane group
// computes it: lane c owns qs chunk c (16 bytes = 16 values of sub-block 2*(c/2) in the low
// nibbles and 16 of sub-block 2*(c/2)+1 in the high nibbles).
//   sum_j w_j x_j ~= D_lo*d_lo*dot(q_lo, a_lo) + D_hi*d_hi*dot(q_hi, a_hi) - (M_lo*S_lo + M_hi*S_hi)
// with D = d*sc, M = dmin*m (exact in fp32), d_* the activation scales, S_* the fp32 sums of the
// unquantised activations over the lane's 16 positions.
#pragma once

#include "gemv/activation_q8.cuh"
#include "q4k/q4k_device.cuh"

namespace encore::gemv {

// A Q4_K block as one lane sees it: the 16-byte header and its 16-byte code chunk.
struct LaneBlock {
  uint4 header;
  uint4 codes;
};

__device__ __forceinline__ LaneBlock load_lane_block(const char* block, int chunk) {
  return {q4k::device::load_weights_16(block), q4k::device::load_weights_16(block + 16 + 16 * chunk)};
}

// The lane's weights decoded once, reused for every token.
struct LaneWeights {
  q4k::device::SubBlockPair sp;
  int lo[4], hi[4];  // the four code words' low / high nibbles
};

__device__ __forceinline__ LaneWeights decode_lane_block(const LaneBlock& w, int chunk) {
  using namespace q4k::device;
  const std::uint32_t words[4] = {w.codes.x, w.codes.y, w.codes.z, w.codes.w};
  LaneWeights out;
  out.sp = decode_pair(w.header, chunk / 2);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out.lo[i] = low_nibbles(words[i]);
    out.hi[i] = high_nibbles(words[i]);
  }
  return out;
}

// One lane's activation operands for a block: its 16 lo and 16 hi codes and {d_lo, d_hi, S_lo, S_hi}.
struct LaneActivations {
  int lo[4], hi[4];
  float4 meta;
};

__device__ __forceinline__ LaneActivations load_lane_activations(const ActBlockView& act, int chunk) {
  const int4 a_lo = *reinterpret_cast<const int4*>(act.codes + chunk * 16);
  const int4 a_hi = *reinterpret_cast<const int4*>(act.codes + 128 + chunk * 16);
  return {{a_lo.x, a_lo.y, a_lo.z, a_lo.w}, {a_hi.x, a_hi.y, a_hi.z, a_hi.w}, act.meta[chunk]};
}

__device__ __forceinline__ float lane_block_dot(const LaneWeights& w, const LaneActivations& a) {
  int dot_lo = 0, dot_hi = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    dot_lo = __dp4a(w.lo[i], a.lo[i], dot_lo);
    dot_hi = __dp4a(w.hi[i], a.hi[i], dot_hi);
  }
  return (w.sp.scale_lo * a.meta.x) * float(dot_lo) + (w.sp.scale_hi * a.meta.y) * float(dot_hi) -
         (w.sp.min_lo * a.meta.z + w.sp.min_hi * a.meta.w);
}

}  // namespace encore::gemv
