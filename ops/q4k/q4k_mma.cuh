// Int8 tensor-core core of the Q4_K GEMV for 5..16 tokens (docs/q4k.md §9): one
// mma.sync.m16n8k32 per sub-block, A = the 4-bit codes of 16 weight rows, B = the int8 codes of 8
// tokens, exact int32 dots; the sub-block scales and mins are applied in fp32 afterwards by the
// dp4a core's own per-pair expression (q4k::pair_term).
//
// k order: a lane (group g = lane / 4, t = lane % 4) reads 8 contiguous bytes at offset 8t of a
// 32-byte qs chunk and gives bytes 8t..8t+3 the mma's k slots 4t..4t+3 and bytes 8t+4..8t+7 the
// slots 16+4t..16+4t+3. The activations use the same map, so each product pairs the weight and the
// activation of one position (a dot product does not care about the order of its k).
#pragma once

#include <cstdint>

#include "q4k/q4k_stream.cuh"

namespace encore::q4k {

// c = A (16 x 32, s8, row-major) * B (32 x 8, s8, column-major), int32, fresh accumulators.
__device__ __forceinline__ void mma_s8_16832(int (&c)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                             std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};\n"
      : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(0));
}

// A fragments of pair p (sub-blocks 2p: low nibbles, 2p+1: high nibbles) from the lane's 8 code
// bytes of its two rows (row g: w0, row g + 8: w1).
struct PairFragments {
  std::uint32_t lo[4], hi[4];
};
__device__ __forceinline__ PairFragments pair_fragments(const uint2 w0, const uint2 w1) {
  using q4k::high_nibbles;
  using q4k::low_nibbles;
  return {{std::uint32_t(low_nibbles(w0.x)), std::uint32_t(low_nibbles(w1.x)), std::uint32_t(low_nibbles(w0.y)),
           std::uint32_t(low_nibbles(w1.y))},
          {std::uint32_t(high_nibbles(w0.x)), std::uint32_t(high_nibbles(w1.x)), std::uint32_t(high_nibbles(w0.y)),
           std::uint32_t(high_nibbles(w1.y))}};
}

// The scale/min pair p of the group's row held by lane `src` (each lane decodes its own pair).
__device__ __forceinline__ q4k::SubBlockPair shuffle_pair(const q4k::SubBlockPair& mine, int src) {
  return {__shfl_sync(0xFFFFFFFFu, mine.scale_lo, src), __shfl_sync(0xFFFFFFFFu, mine.scale_hi, src),
          __shfl_sync(0xFFFFFFFFu, mine.min_lo, src), __shfl_sync(0xFFFFFFFFu, mine.min_hi, src)};
}

}  // namespace encore::q4k
