// fp16 tensor-core core of the Q4_K GEMV (docs/q4k.md §9.2): the weights enter mma.sync.m16n8k16
// as the exact integers sc * q (at most 63 x 15 = 945, exact in fp16), the activations as the
// scaled fp16 values of activation_f16.cuh, so one fp32 accumulator serves a whole 256-value block
// and the block's scales are applied once per (row, token, block):
//   y += 2^-s * (d * sum_i sc_i q_i x'_i - dmin * sum_j m_j S_j)
// The min term is a second, small product (m16n8k8) of the codes 32 m_j with the sums S_j / 32.
// Lane (g, t) dequantises the 32 bytes 32t..32t+31 of each of its rows' qs: word u of them gives
// k step (u, 0) its low nibbles and (u, 1) its high ones; bytes {0, 2} fill the A register of
// k slots 2t, 2t + 1 and bytes {1, 3} that of slots 2t + 8, 2t + 9 (f16_position names them).
#pragma once

#include <cstdint>

#include "q4k/activation_f16.cuh"
#include "q4k/q4k_device.cuh"

namespace encore::q4k {

__device__ __forceinline__ std::uint32_t half2_bits(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const std::uint32_t*>(&h);
}

// fma.rn.f16x2: one rounding, so (1024 + q) * sc - 1024 * sc gives q * sc exactly.
__device__ __forceinline__ std::uint32_t hfma2(std::uint32_t a, std::uint32_t b, std::uint32_t c) {
  std::uint32_t d;
  asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// (a & mask) | 0x64006400 as one LOP3 (written in C++, the compiler splits it in two).
template <std::uint32_t kMask>
__device__ __forceinline__ std::uint32_t nibbles_as_f16(std::uint32_t a) {
  std::uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(a), "n"(kMask), "n"(0x64006400));
  return d;
}

// A row's dequantisation constants for its sub-blocks 2p (low nibbles) and 2p + 1 (high).
// 0x6400 | q is the fp16 1024 + q; 0x6400 | 16q (a high nibble left in place) is 1024 + 16q.
struct RowDequant {
  std::uint32_t mul_lo, add_lo;  // {sc, sc}, {-1024 sc, ...}
  std::uint32_t mul_hi, add_hi;  // {sc / 16, ...}, {-64 sc, ...}
};
__device__ __forceinline__ RowDequant row_dequant(const PairCodes& c) {
  const float lo = float(c.sc & 0xFF), hi = float((c.sc >> 8) & 0xFF);
  return {half2_bits(lo, lo), half2_bits(-1024.f * lo, -1024.f * lo), half2_bits(hi / 16.f, hi / 16.f),
          half2_bits(-64.f * hi, -64.f * hi)};
}

// The four A registers' worth of one row from its code word: [h][r], h = nibble, r = 0 for bytes
// {0, 2} (k slots 2t, 2t + 1), 1 for bytes {1, 3} (slots 2t + 8, 2t + 9); each half2 = sc * q.
__device__ __forceinline__ void dequant_word(std::uint32_t w, const RowDequant& c, std::uint32_t (&out)[2][2]) {
  const std::uint32_t w8 = w >> 8;
  out[0][0] = hfma2(nibbles_as_f16<0x000F000Fu>(w), c.mul_lo, c.add_lo);
  out[0][1] = hfma2(nibbles_as_f16<0x000F000Fu>(w8), c.mul_lo, c.add_lo);
  out[1][0] = hfma2(nibbles_as_f16<0x00F000F0u>(w), c.mul_hi, c.add_hi);
  out[1][1] = hfma2(nibbles_as_f16<0x00F000F0u>(w8), c.mul_hi, c.add_hi);
}

// c += A (16 x 16, f16, row-major) * B (16 x 8, f16, column-major), fp32 accumulators.
__device__ __forceinline__ void mma_f16_16816(float (&c)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// c += A (16 x 8) * B (8 x 8), f16 in, fp32 accumulators.
__device__ __forceinline__ void mma_f16_1688(float (&c)[4], const std::uint32_t (&a)[2], std::uint32_t b) {
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(b));
}

}  // namespace encore::q4k
