// Streaming pieces of the Q4_K core: weights reach shared memory through bulk async
// copies (common/async_copy.cuh), so bytes in flight cost no registers; the
// math then reads a block as one lane of a 4-lane group sees it.
//
// Lane p (0..3) of a group owns qs bytes 32p..32p+31 of a block: all 32 values of sub-block 2p
// (low nibbles) and of sub-block 2p+1 (high nibbles), docs/q4k.md §3. One scale/min pair decode
// serves 64 weights (an 8-lane split would decode it once per 32), and in the int8
// activation layout of activation_q8.cuh those 64 codes are contiguous: lo codes 32p..32p+31,
// hi codes 128+32p..+31, meta[2p] and meta[2p+1].
#pragma once

#include <cstdint>

#include <encore/q4k.h>

#include "common/async_copy.cuh"
#include "q4k/activation_q8.cuh"
#include "q4k/q4k_device.cuh"

namespace encore::q4k {

// Row pitch of `blocks` Q4_K blocks in a ring slot of shared memory: an odd number of 16-byte
// units, so the two groups of a quarter warp (neighbouring rows, same block) read different banks.
__host__ __device__ constexpr int slot_pitch(int blocks) {
  return blocks * kBlockBytes + (blocks % 2 == 0 ? 16 : 0);
}

// ---- one block as lane p of a 4-lane group sees it ----------------------------------------------

// Per-lane constants of the scale/min unpacking (docs/q4k.md §2): pair p reads 16-bit half
// p & 1 of the scale words; pairs 0-1 are `S & 0x3F3F`, pairs 2-3 combine the low nibbles of
// S[8..11] with bits 7-6 of S[0..7]. Selected once per lane, so the decode has no branch.
struct PairUnpack {
  std::uint32_t shift;     // 0 or 16
  std::uint32_t nib_mask;  // 0 (pairs 0-1) or 0x0F0F
  std::uint32_t top_shift; // 0 or 2
  std::uint32_t top_mask;  // 0x3F3F or 0x3030
};

__device__ __forceinline__ PairUnpack pair_unpack(int p) {
  const bool upper = p >= 2;
  return {std::uint32_t(16 * (p & 1)), upper ? 0x0F0Fu : 0u, upper ? 2u : 0u, upper ? 0x3030u : 0x3F3Fu};
}

struct QuadWeights {
  q4k::SubBlockPair sp;  // scale/min of sub-blocks 2p (lo) and 2p+1 (hi)
  int lo[8];                     // 32 codes of sub-block 2p, as dp4a words
  std::uint32_t hi16[8];         // 32 codes of sub-block 2p+1 times 16 (left in the high nibbles: no shift)
};

// `block` points at a 144-byte block in shared memory (16-byte aligned); same values as
// q4k::decode_pair(header, p).
__device__ __forceinline__ QuadWeights decode_quad(const char* block, int p, const PairUnpack& u) {
  using namespace q4k;
  const uint4 header = *reinterpret_cast<const uint4*>(block);
  const uint4 c0 = *reinterpret_cast<const uint4*>(block + 16 + 32 * p);
  const uint4 c1 = *reinterpret_cast<const uint4*>(block + 32 + 32 * p);
  const std::uint32_t words[8] = {c0.x, c0.y, c0.z, c0.w, c1.x, c1.y, c1.z, c1.w};
  const std::uint32_t s03 = header.y >> u.shift, s47 = header.z >> u.shift, s811 = header.w >> u.shift;
  const std::uint32_t sc = (s811 & u.nib_mask) | ((s03 >> u.top_shift) & u.top_mask);
  const std::uint32_t m = ((s811 >> 4) & u.nib_mask) | ((s47 >> u.top_shift) & u.top_mask);
  const __half2 dm = *reinterpret_cast<const __half2*>(&header.x);
  const float d = __low2float(dm), dmin = __high2float(dm);
  QuadWeights w;
  w.sp = {d * float(sc & 0xFF), d * float((sc >> 8) & 0xFF), dmin * float(m & 0xFF), dmin * float((m >> 8) & 0xFF)};
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    w.lo[i] = low_nibbles(words[i]);
    w.hi16[i] = words[i] & 0xF0F0F0F0u;
  }
  return w;
}

// One token's int8 scales and sums of the unquantised values of sub-blocks 2p and 2p+1, from an
// activation block (activation_q8.cuh: meta[2p] = {d_lo, d_hi, sum_lo, sum_hi} of positions 0..15,
// meta[2p+1].zw the sums of positions 16..31).
struct PairActScales {
  float d_lo, d_hi;  // int8 scales of sub-blocks 2p and 2p+1
  float s_lo, s_hi;  // sums of their 32 unquantised values (two 16-value sums each)
};
__device__ __forceinline__ PairActScales pair_act_scales(const char* act, int p) {
  const float4 m0 = *reinterpret_cast<const float4*>(act + 256 + 32 * p);       // meta[2p]
  const float2 m1 = *reinterpret_cast<const float2*>(act + 256 + 32 * p + 24);  // meta[2p+1].zw
  return {m0.x, m0.y, m0.z + m1.x, m0.w + m1.y};
}

// A pair's contribution to one (row, token) sum from the int32 dots of its two sub-blocks:
//   D_lo*d_lo*dot_lo + D_hi*d_hi*dot_hi - (M_lo*S_lo + M_hi*S_hi)
__device__ __forceinline__ float pair_term(const q4k::SubBlockPair& w, const PairActScales& a, int dot_lo,
                                           int dot_hi) {
  return (w.scale_lo * a.d_lo) * float(dot_lo) + (w.scale_hi * a.d_hi) * float(dot_hi) -
         (w.min_lo * a.s_lo + w.min_hi * a.s_hi);
}

struct QuadActivations {
  int lo[8], hi[8];
  PairActScales scales;
};

// `act` is one token's kActBlockBytes block in shared memory.
__device__ __forceinline__ QuadActivations load_quad_activations(const char* act, int p) {
  const int4 l0 = *reinterpret_cast<const int4*>(act + 32 * p), l1 = *reinterpret_cast<const int4*>(act + 32 * p + 16);
  const int4 h0 = *reinterpret_cast<const int4*>(act + 128 + 32 * p), h1 = *reinterpret_cast<const int4*>(act + 144 + 32 * p);
  return {{l0.x, l0.y, l0.z, l0.w, l1.x, l1.y, l1.z, l1.w},
          {h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w},
          pair_act_scales(act, p)};
}

// dp4a of unsigned bytes (a) with signed bytes (b).
__device__ __forceinline__ int dp4a_us(std::uint32_t a, int b, int c) {
  int d;
  asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// sum over the lane's 64 weights of w_j * a_j, with a_j the int8 activations. The high codes'
// dot is 16 times the true one (at most 32 x 240 x 128 in magnitude), divided exactly by a shift.
__device__ __forceinline__ float quad_dot(const QuadWeights& w, const QuadActivations& a) {
  int dot_lo = 0, dot_hi16 = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    dot_lo = __dp4a(w.lo[i], a.lo[i], dot_lo);
    dot_hi16 = dp4a_us(w.hi16[i], a.hi[i], dot_hi16);
  }
  return pair_term(w.sp, a.scales, dot_lo, dot_hi16 >> 4);
}

}  // namespace encore::q4k
