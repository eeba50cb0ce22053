// Device-side view of a Q4_K block: the pieces every kernel that reads Q4_K weights shares.
// A block is one 16-byte header chunk (d, dmin, scales) plus eight 16-byte `qs` chunks. Chunk c
// (0..7) holds, in its low nibbles, values 16*(c%2)..+15 of sub-block 2*(c/2) and, in its high
// nibbles, the same positions of sub-block 2*(c/2)+1 (docs/q4k.md §3).
#pragma once

#include <cstdint>

#include <cuda_fp16.h>

namespace encore::q4k {

// Scale/min pair of the sub-blocks (2p, 2p+1) of a block, p = chunk / 2, as floats:
// lo/hi = even/odd sub-block. D*sc and M*m are exact in fp32 (docs/q4k.md §4).
struct SubBlockPair {
  float scale_lo, scale_hi;  // d * sc[2p], d * sc[2p+1]
  float min_lo, min_hi;      // dmin * m[2p], dmin * m[2p+1]
};

// The 6-bit codes of sub-blocks 2p (byte 0) and 2p + 1 (byte 1) and the block's d, dmin.
// `header` = the block's first 16 bytes as four words: {d|dmin, S[0..3], S[4..7], S[8..11]};
// branch-free in p (0..3): ggml's 16-bit-word trick.
struct PairCodes {
  std::uint32_t sc, m;
  float d, dmin;
};
__device__ __forceinline__ PairCodes pair_codes(const uint4& header, int p) {
  const int k = p & 1;  // which 16-bit half of a word
  const std::uint32_t s03 = header.y >> (16 * k), s47 = header.z >> (16 * k), s811 = header.w >> (16 * k);
  PairCodes c;
  if (p < 2) {
    c.sc = s03 & 0x3F3F;
    c.m = s47 & 0x3F3F;
  } else {
    c.sc = (s811 & 0x0F0F) | ((s03 & 0xC0C0) >> 2);
    c.m = ((s811 >> 4) & 0x0F0F) | ((s47 & 0xC0C0) >> 2);
  }
  const __half2 dm = *reinterpret_cast<const __half2*>(&header.x);
  c.d = __low2float(dm);
  c.dmin = __high2float(dm);
  return c;
}

// The scale/min pair p as floats.
__device__ __forceinline__ SubBlockPair decode_pair(const uint4& header, int p) {
  const PairCodes c = pair_codes(header, p);
  return {c.d * float(c.sc & 0xFF), c.d * float(c.sc >> 8), c.dmin * float(c.m & 0xFF), c.dmin * float(c.m >> 8)};
}

// Low / high nibbles of a 32-bit word of codes, as four bytes 0..15 (dp4a operands).
__device__ __forceinline__ int low_nibbles(std::uint32_t w) { return int(w & 0x0F0F0F0Fu); }
__device__ __forceinline__ int high_nibbles(std::uint32_t w) { return int((w >> 4) & 0x0F0F0F0Fu); }

// Streaming 16-byte load for weights: read once per step, so keep them out of L1 and mark them
// evict-first in L2. Weights are never written during a step: the non-coherent path is safe.
__device__ __forceinline__ std::uint64_t evict_first_policy() {
  std::uint64_t policy;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

__device__ __forceinline__ uint4 load_weights_16(const void* ptr) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(ptr), "l"(evict_first_policy()));
  return v;
}

}  // namespace encore::q4k
