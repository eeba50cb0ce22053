// The fp16 tensor-core core of the Q4_K GEMV on the CPU (docs/q4k.md §9.2): its layout functions,
// its dequantisation trick and one warp's mma.sync steps emulated element by element from the
// PTX fragment layouts, so a mismatch between the weights' k order, the activations' layout and
// the fragments fails here without a GPU. Also the fp16 activation format's reference and its
// error bound.
#include <encore/q4k.h>
#include <encore/ref/q4k_gemv.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <set>

#include "gemv/gemv_test_data.h"
#include "q4k/activation_f16_layout.h"
#include "test_util.h"

namespace encore {
namespace {

using q4k::f16_position;
using q4k::f16_value_byte_offset;
using q4k::f16_value_offset;
using q4k::f16_value_slot;

double half_value(std::uint16_t h) { return q4k::half_to_float(h); }
std::uint16_t lo16(std::uint32_t r) { return std::uint16_t(r & 0xFFFF); }
std::uint16_t hi16(std::uint32_t r) { return std::uint16_t(r >> 16); }
std::uint32_t pack(std::uint16_t lo, std::uint16_t hi) { return std::uint32_t(lo) | std::uint32_t(hi) << 16; }
std::uint32_t half2_of(float lo, float hi) { return pack(q4k::float_to_half(lo), q4k::float_to_half(hi)); }

// fma.rn.f16x2 on values whose exact result fits a float (here always): one rounding to fp16.
std::uint32_t hfma2(std::uint32_t a, std::uint32_t b, std::uint32_t c) {
  auto one = [](std::uint16_t x, std::uint16_t y, std::uint16_t z) {
    return q4k::float_to_half(float(half_value(x) * half_value(y) + half_value(z)));
  };
  return pack(one(lo16(a), lo16(b), lo16(c)), one(hi16(a), hi16(b), hi16(c)));
}

// q4k_mma_f16.cuh's dequant_word, on the host: [nibble][register] of sc * q.
struct Dequant {
  std::uint32_t mul_lo, add_lo, mul_hi, add_hi;
};
Dequant dequant_of(int sc_lo, int sc_hi) {
  return {half2_of(sc_lo, sc_lo), half2_of(-1024.f * sc_lo, -1024.f * sc_lo), half2_of(sc_hi / 16.f, sc_hi / 16.f),
          half2_of(-64.f * sc_hi, -64.f * sc_hi)};
}
void dequant_word(std::uint32_t w, const Dequant& c, std::uint32_t (&out)[2][2]) {
  constexpr std::uint32_t kMagic = 0x64006400u;
  const std::uint32_t w8 = w >> 8;
  out[0][0] = hfma2((w & 0x000F000Fu) | kMagic, c.mul_lo, c.add_lo);
  out[0][1] = hfma2((w8 & 0x000F000Fu) | kMagic, c.mul_lo, c.add_lo);
  out[1][0] = hfma2((w & 0x00F000F0u) | kMagic, c.mul_hi, c.add_hi);
  out[1][1] = hfma2((w8 & 0x00F000F0u) | kMagic, c.mul_hi, c.add_hi);
}

TEST(Q4kF16Layout, PositionsAndOffsetsAreBijections) {
  std::set<int> positions, offsets;
  for (int t = 0; t < 4; ++t)
    for (int u = 0; u < 8; ++u)
      for (int h = 0; h < 2; ++h)
        for (int i = 0; i < 4; ++i) {
          const int p = f16_position(t, u, h, i);
          positions.insert(p);
          const int off = f16_value_offset(u, t, h) + 2 * f16_value_slot(i);
          offsets.insert(off);
          EXPECT_EQ(f16_value_byte_offset(p), off) << t << " " << u << " " << h << " " << i;
          // The weight side: byte 4u + i of lane t's chunk, nibble h, is this position in Q4_K.
          const int qs_byte = 32 * t + 4 * u + i;
          EXPECT_EQ(p, 64 * (qs_byte / 32) + 32 * h + qs_byte % 32);
        }
  EXPECT_EQ(positions.size(), 256u);
  EXPECT_EQ(*positions.rbegin(), 255);
  EXPECT_EQ(offsets.size(), 256u);
  EXPECT_EQ(*offsets.rbegin(), 510);
  // The writer's 8-byte groups: positions 4m .. 4m + 3 fill one group, slot by slot.
  for (int m = 0; m < 64; ++m)
    for (int i = 0; i < 4; ++i) EXPECT_EQ(f16_value_byte_offset(4 * m + i), f16_value_byte_offset(4 * m) + 2 * f16_value_slot(i));
  std::set<int> sums;
  for (int j = 0; j < 8; ++j)
    for (int lo = 0; lo < 2; ++lo) {
      const int off = q4k::f16_sum_offset(j, lo);
      sums.insert(off);
      EXPECT_EQ(off / 8, j / 2);               // lane t = j / 2 reads 8 bytes at 8t
      EXPECT_EQ((off % 8) / 4, lo);            // hi pair, then lo pair
      EXPECT_EQ((off % 4) / 2, j % 2);         // k slot 2t (low half) or 2t + 1
    }
  EXPECT_EQ(sums.size(), 16u);
}

TEST(Q4kF16Layout, DequantTrickIsExactForEveryCodeAndScale) {
  for (int sc = 0; sc < 64; ++sc)
    for (int q = 0; q < 16; ++q)
      for (int q2 = 0; q2 < 16; q2 += 5) {
        // Byte 0 = (q2 << 4) | q, byte 1 = (q << 4) | q2, byte 2 = q2 | (q << 4), byte 3 = q | (q2 << 4).
        const std::uint32_t w = std::uint32_t((q2 << 4) | q) | std::uint32_t((q << 4) | q2) << 8 |
                                std::uint32_t((q << 4) | q2) << 16 | std::uint32_t((q2 << 4) | q) << 24;
        std::uint32_t f[2][2];
        dequant_word(w, dequant_of(sc, sc), f);
        const int lo[4] = {q, q2, q2, q}, hi[4] = {q2, q, q, q2};  // per byte
        for (int i = 0; i < 4; ++i) {
          const int reg = i & 1, half = i >> 1;
          auto value = [&](std::uint32_t r) { return half_value(half ? hi16(r) : lo16(r)); };
          EXPECT_EQ(value(f[0][reg]), double(sc * lo[i])) << sc << " " << q << " byte " << i;
          EXPECT_EQ(value(f[1][reg]), double(sc * hi[i])) << sc << " " << q << " byte " << i;
        }
      }
}

// One warp of the fp16 core on one K block of a 16-row group and 8 tokens, emulated from the PTX
// fragment layouts of mma.m16n8k16 and m16n8k8 (f16 inputs): both accumulations equal the exact
// sums (every product and partial sum is exact in double).
TEST(Q4kF16Layout, WarpEmulationMatchesTheBlockSums) {
  const std::uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(seed);
  std::mt19937_64 rng(seed);
  constexpr int kRows = 16, kTokens = 8;
  for (int trial = 0; trial < 20; ++trial) {
    const auto w = test::random_q4k_matrix(kRows, 256, rng);
    std::vector<ref::F16Activations> act;
    std::vector<std::array<std::uint16_t, 256>> image(kTokens);    // the values, as the kernel lays them out
    std::vector<std::array<std::uint16_t, 16>> sums_image(kTokens);
    for (int n = 0; n < kTokens; ++n) {
      const auto x = test::random_normal(256, rng, 0.f, trial % 2 ? 1e3f : 1e-2f);
      act.push_back(ref::quantize_activations_f16(x.data(), 256));
      for (int p = 0; p < 256; ++p) image[n][f16_value_byte_offset(p) / 2] = q4k::float_to_half(act[n].values[p]);
      for (int j = 0; j < 8; ++j) {
        sums_image[n][q4k::f16_sum_offset(j, 0) / 2] = q4k::float_to_half(act[n].sum_hi[j]);
        sums_image[n][q4k::f16_sum_offset(j, 1) / 2] = q4k::float_to_half(act[n].sum_lo[j]);
      }
    }
    // Per lane (g, t): its rows' dequantised registers [row g / g + 8][u][nibble][register].
    std::uint32_t a_regs[32][2][8][2][2];
    std::uint32_t a_min[32][2];
    for (int lane = 0; lane < 32; ++lane) {
      const int g = lane / 4, t = lane % 4;
      for (int r = 0; r < 2; ++r) {
        const q4k::Block& b = w[g + 8 * r];
        std::uint8_t sc[8], m[8];
        q4k::unpack_scales(b, sc, m);
        const Dequant dq = dequant_of(sc[2 * t], sc[2 * t + 1]);
        for (int u = 0; u < 8; ++u) {
          std::uint32_t word;
          std::memcpy(&word, b.qs + 32 * t + 4 * u, 4);
          dequant_word(word, dq, a_regs[lane][r][u]);
        }
        a_min[lane][r] = half2_of(32.f * m[2 * t], 32.f * m[2 * t + 1]);
      }
    }
    double c1[kRows][kTokens] = {}, c2[kRows][kTokens] = {};
    for (int u = 0; u < 8; ++u)
      for (int h = 0; h < 2; ++h)
        for (int row = 0; row < kRows; ++row)
          for (int col = 0; col < kTokens; ++col)
            for (int k = 0; k < 16; ++k) {
              // A[row][k]: lane (row % 8, (k % 8) / 2), register {a0a1, a2a3, a4a5, a6a7} =
              // (row >= 8) + 2 (k >= 8), half k % 2; the kernel's a = {f[0][h][0], f[1][h][0], f[0][h][1], f[1][h][1]}.
              const int a_lane = 4 * (row % 8) + (k % 8) / 2;
              const std::uint32_t a = a_regs[a_lane][row / 8][u][h][k / 8];
              // B[k][col]: lane (col, (k % 8) / 2), register k >= 8, half k % 2; the kernel loads
              // 8 bytes at f16_value_offset(u, t, h) of token col: register 0 then 1.
              const int t = (k % 8) / 2;
              const int base = f16_value_offset(u, t, h) / 2 + 2 * (k / 8);
              const std::uint32_t b = pack(image[col][base], image[col][base + 1]);
              c1[row][col] += half_value(k % 2 ? hi16(a) : lo16(a)) * half_value(k % 2 ? hi16(b) : lo16(b));
            }
    for (int row = 0; row < kRows; ++row)
      for (int col = 0; col < kTokens; ++col)
        for (int k = 0; k < 8; ++k) {
          const std::uint32_t a = a_min[4 * (row % 8) + k / 2][row / 8];
          const int t = k / 2;
          const std::uint32_t hi = pack(sums_image[col][4 * t], sums_image[col][4 * t + 1]);
          const std::uint32_t lo = pack(sums_image[col][4 * t + 2], sums_image[col][4 * t + 3]);
          const double av = half_value(k % 2 ? hi16(a) : lo16(a));
          c2[row][col] += av * half_value(k % 2 ? hi16(hi) : lo16(hi)) + av * half_value(k % 2 ? hi16(lo) : lo16(lo));
        }
    for (int row = 0; row < kRows; ++row) {
      std::uint8_t sc[8], m[8];
      q4k::unpack_scales(w[row], sc, m);
      for (int col = 0; col < kTokens; ++col) {
        double dot = 0, mins = 0, dot_mag = 0, mins_mag = 0;
        for (int p = 0; p < 256; ++p) {
          const int s = p / 32, byte = 32 * (s / 2) + p % 32;
          const int q = s % 2 ? w[row].qs[byte] >> 4 : w[row].qs[byte] & 0x0F;
          dot += double(sc[s] * q) * act[col].values[p];
          dot_mag += std::fabs(double(sc[s] * q) * act[col].values[p]);
        }
        for (int j = 0; j < 8; ++j) {
          mins += 32.0 * m[j] * (double(act[col].sum_hi[j]) + double(act[col].sum_lo[j]));
          mins_mag += 32.0 * m[j] * (std::fabs(act[col].sum_hi[j]) + std::fabs(act[col].sum_lo[j]));
        }
        ASSERT_NEAR(c1[row][col], dot, 1e-12 * dot_mag) << "row " << row << " token " << col;
        ASSERT_NEAR(c2[row][col], mins, 1e-12 * mins_mag) << "row " << row << " token " << col;
      }
    }
  }
}

TEST(Q4kF16Activations, ScalesKeepValuesInRange) {
  const std::uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(seed);
  std::mt19937_64 rng(seed);
  for (float stddev : {0.f, 1e-30f, 1e-3f, 1.f, 3e4f, 1e30f}) {
    const auto x = test::random_normal(512, rng, 0.f, stddev);
    const auto a = ref::quantize_activations_f16(x.data(), 512);
    for (int b = 0; b < 2; ++b) {
      float amax = 0.f, vmax = 0.f;
      for (int i = 0; i < 256; ++i) {
        amax = std::max(amax, std::fabs(x[256 * b + i]));
        vmax = std::max(vmax, std::fabs(a.values[256 * b + i]));
        ASSERT_TRUE(std::isfinite(a.values[256 * b + i]));
        // fp16 rounding only: relative 2^-11 (values far below the block's largest may lose more
        // as fp16 subnormals; bounded here by 2^-24 of the scaled unit).
        const double exact = double(x[256 * b + i]) / a.block_scale[b];
        EXPECT_LE(std::fabs(a.values[256 * b + i] - exact), std::ldexp(std::fabs(exact), -11) + std::ldexp(1.0, -25)) << stddev;
      }
      if (amax > 0.f && stddev > 1e-30f) {
        EXPECT_GE(vmax, 16384.f) << stddev;
        EXPECT_LE(vmax, 32768.f) << stddev;
      }
      for (int j = 0; j < 8; ++j) ASSERT_TRUE(std::isfinite(a.sum_hi[8 * b + j]) && std::isfinite(a.sum_lo[8 * b + j]));
    }
  }
}

// The fp16 reference against the exact product: within the int8 format's bound (which the
// GPU tests apply to the fp16 core) with a wide margin.
TEST(Q4kF16Activations, ReferenceWithinTheInt8Bound) {
  const std::uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(seed);
  std::mt19937_64 rng(seed);
  constexpr std::int64_t kN = 64, kK = 2304;
  const auto w = test::random_q4k_matrix(kN, kK, rng);
  const auto x = test::random_normal(kK, rng);
  std::vector<double> exact(kN), f16(kN), bound(kN), magnitude(kN);
  ref::q4k_gemv(w.data(), kN, kK, x.data(), 1, kK, nullptr, exact.data());
  ref::q4k_gemv_f16(w.data(), kN, kK, ref::quantize_activations_f16(x.data(), kK), f16.data());
  ref::q4k_gemv_error_model(w.data(), kN, kK, x.data(), bound.data(), magnitude.data());
  double worst = 0;
  for (std::int64_t r = 0; r < kN; ++r) {
    EXPECT_LE(std::fabs(f16[r] - exact[r]), bound[r]) << r;
    worst = std::max(worst, std::fabs(f16[r] - exact[r]) / bound[r]);
  }
  EXPECT_LT(worst, 0.25);  // fp16 rounds about 16x finer than int8
}

}  // namespace
}  // namespace encore
