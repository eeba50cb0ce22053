// Q4_K format: layout, scale packing, decode (hand-built blocks, special d/dmin), the quantiser's
// round trip, and a cross-check against gguf-py (an independent decoder) when it is installed.
#include <encore/q4k.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <cuda_fp16.h>

#include "test_util.h"

namespace encore::q4k {
namespace {

// Value j of a block, decoded straight from the bytes by the formulas of docs/q4k.md §2-§4,
// independently of unpack_scales / dequantize_row.
float spec_value(const Block& b, int j) {
  const auto* B = reinterpret_cast<const std::uint8_t*>(&b);
  const int s = j / 32;
  const std::uint8_t* S = B + 4;
  int sc, m;
  if (s < 4) {
    sc = S[s] & 0x3F;
    m = S[s + 4] & 0x3F;
  } else {
    sc = (S[s + 4] & 0x0F) | ((S[s - 4] >> 6) << 4);
    m = (S[s + 4] >> 4) | ((S[s] >> 6) << 4);
  }
  const std::uint8_t byte = B[16 + 32 * (j / 64) + j % 32];
  const int q = s % 2 == 0 ? byte & 0x0F : byte >> 4;
  const float d = __half2float(__ushort_as_half(b.d)), dmin = __half2float(__ushort_as_half(b.dmin));
  return (d * float(sc)) * float(q) - dmin * float(m);
}

std::uint16_t half_bits(float f) { return __half_as_ushort(__float2half_rn(f)); }

// Distinct scales and mins per sub-block with the high bits of sub-blocks 4..7 set, and codes that
// differ between the low and high nibble of every byte.
Block hand_built_block() {
  Block b{};
  const std::uint8_t sc[8] = {33, 7, 45, 63, 17, 52, 29, 61};
  const std::uint8_t m[8] = {2, 40, 11, 58, 23, 31, 48, 16};
  pack_scales(sc, m, b);
  b.d = half_bits(0.0123f);
  b.dmin = half_bits(0.0071f);
  for (int i = 0; i < 128; ++i) b.qs[i] = std::uint8_t((i * 7 + 3) % 16 | (((i * 5 + 11) % 16) << 4));
  return b;
}

TEST(Q4kFormat, LayoutMatchesGgml) {
  EXPECT_EQ(sizeof(Block), 144u);
  EXPECT_EQ(offsetof(Block, d), 0u);
  EXPECT_EQ(offsetof(Block, dmin), 2u);
  EXPECT_EQ(offsetof(Block, scales), 4u);
  EXPECT_EQ(offsetof(Block, qs), 16u);
  EXPECT_EQ(row_bytes(2304), 9 * 144);
}

TEST(Q4kFormat, ScalePackingRoundTripsEveryValue) {
  for (int v = 0; v < 64; ++v)
    for (int s = 0; s < 8; ++s) {
      std::uint8_t sc[8] = {1, 2, 3, 4, 5, 6, 7, 8}, m[8] = {9, 10, 11, 12, 13, 14, 15, 16}, sc2[8], m2[8];
      sc[s] = std::uint8_t(v);
      m[7 - s] = std::uint8_t(63 - v);
      Block b{};
      pack_scales(sc, m, b);
      unpack_scales(b, sc2, m2);
      ASSERT_EQ(0, std::memcmp(sc, sc2, 8)) << "v=" << v << " s=" << s;
      ASSERT_EQ(0, std::memcmp(m, m2, 8)) << "v=" << v << " s=" << s;
    }
}

TEST(Q4kFormat, HandBuiltBlockDecodesPerSpecTable) {
  const Block b = hand_built_block();
  std::vector<float> out(256);
  ASSERT_TRUE(dequantize_row(&b, out.data(), 256).ok());
  for (int j = 0; j < 256; ++j) ASSERT_EQ(out[j], spec_value(b, j)) << "j=" << j;
  // Spot checks straight from docs/q4k.md §4's table.
  const auto* B = reinterpret_cast<const std::uint8_t*>(&b);
  const float d = __half2float(__ushort_as_half(b.d)), dmin = __half2float(__ushort_as_half(b.dmin));
  EXPECT_EQ(out[100], d * float(B[7] & 63) * float(B[52] >> 4) - dmin * float(B[11] & 63));
  EXPECT_EQ(out[200], d * float((B[14] & 15) + 16 * (B[6] >> 6)) * float(B[120] & 15) -
                          dmin * float((B[14] >> 4) + 16 * (B[10] >> 6)));
  EXPECT_EQ(out[255], d * float((B[15] & 15) + 16 * (B[7] >> 6)) * float(B[143] >> 4) -
                          dmin * float((B[15] >> 4) + 16 * (B[11] >> 6)));
}

TEST(Q4kFormat, OneHotCodesLandOnTheirValue) {
  Block b = hand_built_block();
  std::memset(b.qs, 0, sizeof(b.qs));
  std::uint8_t sc[8], m[8];
  unpack_scales(b, sc, m);
  const float d = half_to_float(b.d), dmin = half_to_float(b.dmin);
  for (int j = 0; j < 256; ++j) {
    Block one = b;
    const int byte = 32 * (j / 64) + j % 32;
    one.qs[byte] = (j / 32) % 2 == 0 ? 0x0F : 0xF0;
    std::vector<float> out(256);
    ASSERT_TRUE(dequantize_row(&one, out.data(), 256).ok());
    for (int i = 0; i < 256; ++i) {
      const float expected = (d * sc[i / 32]) * (i == j ? 15.f : 0.f) - dmin * m[i / 32];
      ASSERT_EQ(out[i], expected) << "hot j=" << j << " i=" << i;
    }
  }
}

TEST(Q4kFormat, SpecialScaleValues) {
  const std::uint16_t specials[] = {0x0000, 0x8000, 0x0001, 0x03FF, 0x8001, 0xBC00 /* -1 */, 0x7BFF /* 65504 */};
  for (std::uint16_t d : specials)
    for (std::uint16_t dmin : specials) {
      Block b = hand_built_block();
      b.d = d;
      b.dmin = dmin;
      std::vector<float> out(256);
      ASSERT_TRUE(dequantize_row(&b, out.data(), 256).ok());
      for (int j = 0; j < 256; ++j) ASSERT_EQ(out[j], spec_value(b, j)) << std::hex << d << " " << dmin << " j=" << std::dec << j;
    }
  // The largest block: sc = m = 63, d = dmin = 65504, all codes 15.
  Block big{};
  std::uint8_t all63[8] = {63, 63, 63, 63, 63, 63, 63, 63};
  pack_scales(all63, all63, big);
  big.d = big.dmin = 0x7BFF;
  std::memset(big.qs, 0xFF, sizeof(big.qs));
  std::vector<float> out(256);
  ASSERT_TRUE(dequantize_row(&big, out.data(), 256).ok());
  for (float v : out) EXPECT_EQ(v, 65504.f * 63.f * 15.f - 65504.f * 63.f);
}

TEST(Q4kFormat, HalfConversionsMatchCuda) {
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const float f = half_to_float(std::uint16_t(h));
    const float expected = __half2float(__ushort_as_half(std::uint16_t(h)));
    if (std::isnan(expected)) {
      ASSERT_TRUE(std::isnan(f));
      continue;
    }
    ASSERT_EQ(std::memcmp(&f, &expected, 4), 0) << "h=" << h;
    ASSERT_EQ(float_to_half(f), h) << "h=" << h;
  }
  std::mt19937_64 rng(test::fresh_seed());
  std::uniform_int_distribution<std::uint32_t> bits;
  for (int i = 0; i < 200000; ++i) {
    std::uint32_t u = bits(rng);
    float f;
    std::memcpy(&f, &u, 4);
    if (std::isnan(f)) continue;
    ASSERT_EQ(float_to_half(f), half_bits(f)) << "f=" << f;
  }
}

double round_trip_error(const std::vector<float>& x) {
  std::vector<Block> q(x.size() / 256);
  std::vector<float> y(x.size());
  EXPECT_TRUE(quantize_row(x.data(), q.data(), std::int64_t(x.size())).ok());
  EXPECT_TRUE(dequantize_row(q.data(), y.data(), std::int64_t(x.size())).ok());
  return test::rel_l2(y, x);
}

TEST(Q4kQuantize, RoundTripErrorOnRandomData) {
  const std::uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(seed);
  std::mt19937_64 rng(seed);
  // 4.5 bits per weight: Gaussian data round-trips to ~7% relative L2 (measured); bound 0.10.
  EXPECT_LT(round_trip_error(test::random_normal(256 * 64, rng)), 0.10);
  EXPECT_LT(round_trip_error(test::random_uniform(256 * 64, rng, -3.f, 5.f)), 0.10);
  // All-positive data: the fitted min is clamped at 0 (ggml), so 16 levels span 0..3: ~2.2%.
  EXPECT_LT(round_trip_error(test::random_uniform(256 * 64, rng, 2.f, 3.f)), 0.03);
}

TEST(Q4kQuantize, EdgeBlocks) {
  std::vector<float> zeros(256, 0.f), constant(256, -1.5f), positive(256, 2.25f), tiny(256), with_zero_sub(256);
  std::mt19937_64 rng(test::fresh_seed());
  auto g = test::random_normal(256, rng);
  for (int i = 0; i < 256; ++i) {
    tiny[i] = g[i] * 1e-30f;  // d underflows to 0 in fp16: step 4 keeps the fitted codes
    with_zero_sub[i] = i / 32 == 3 ? 0.f : g[i];
  }
  std::vector<float> y(256);
  Block b;
  ASSERT_TRUE(quantize_row(zeros.data(), &b, 256).ok());
  ASSERT_TRUE(dequantize_row(&b, y.data(), 256).ok());
  for (float v : y) EXPECT_EQ(v, 0.f);

  ASSERT_TRUE(quantize_row(constant.data(), &b, 256).ok());
  ASSERT_TRUE(dequantize_row(&b, y.data(), 256).ok());
  for (float v : y) EXPECT_NEAR(v, -1.5f, 1.5f * 2e-3f);  // the min carries it (fp16 dmin * 63)

  ASSERT_TRUE(quantize_row(positive.data(), &b, 256).ok());
  ASSERT_TRUE(dequantize_row(&b, y.data(), 256).ok());
  for (float v : y) EXPECT_NEAR(v, 2.25f, 2.25f * 2e-3f);

  ASSERT_TRUE(quantize_row(with_zero_sub.data(), &b, 256).ok());
  ASSERT_TRUE(dequantize_row(&b, y.data(), 256).ok());
  for (int i = 96; i < 128; ++i) EXPECT_NEAR(y[i], 0.f, 1e-6f);

  ASSERT_TRUE(quantize_row(tiny.data(), &b, 256).ok());
  EXPECT_EQ(half_to_float(b.d), 0.f);
  ASSERT_TRUE(dequantize_row(&b, y.data(), 256).ok());
  for (float v : y) EXPECT_TRUE(std::isfinite(v));
}

// gguf-py (PyPI) decodes Q4_K with numpy; it must agree with dequantize_row bit for bit.
TEST(Q4kFormat, MatchesGgufPyDecoder) {
  if (std::system("python3 -c 'import gguf.quants' >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "gguf-py not importable (pip install gguf); cross-check skipped";
  const std::uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(seed);
  std::mt19937_64 rng(seed);
  const int blocks = 4096;
  std::vector<Block> q(blocks);
  auto* bytes = reinterpret_cast<std::uint8_t*>(q.data());
  for (std::size_t i = 0; i < q.size() * sizeof(Block); ++i) bytes[i] = std::uint8_t(rng());
  std::normal_distribution<float> scale(0.f, 0.02f);
  for (auto& b : q) {  // finite d / dmin, both signs, some subnormal and zero
    b.d = half_bits(scale(rng));
    b.dmin = rng() % 8 == 0 ? std::uint16_t(rng() % 0x400) : half_bits(scale(rng));
  }
  const std::string dir = testing::TempDir();
  const std::string in = dir + "encore_q4k_in.bin", out = dir + "encore_q4k_out.bin";
  std::ofstream(in, std::ios::binary).write(reinterpret_cast<const char*>(bytes), std::streamsize(q.size() * sizeof(Block)));
  const std::string cmd = "python3 -c \"import numpy as np, gguf; from gguf.quants import dequantize; "
                          "r = np.fromfile('" + in + "', dtype=np.uint8).reshape(" + std::to_string(blocks) + ", 144); "
                          "dequantize(r, gguf.GGMLQuantizationType.Q4_K).astype(np.float32).tofile('" + out + "')\"";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::vector<float> theirs(std::size_t(blocks) * 256), ours(theirs.size());
  std::ifstream(out, std::ios::binary).read(reinterpret_cast<char*>(theirs.data()), std::streamsize(theirs.size() * 4));
  ASSERT_TRUE(dequantize_row(q.data(), ours.data(), std::int64_t(ours.size())).ok());
  for (std::size_t i = 0; i < ours.size(); ++i)
    ASSERT_EQ(std::memcmp(&ours[i], &theirs[i], 4), 0) << "value " << i << ": ours " << ours[i] << " gguf " << theirs[i];
}


// A row length that is not whole blocks is refused, and nothing is written.
TEST(Q4kFormat, RowsMustBeWholeBlocks) {
  std::vector<float> x(512, 1.f), y(512, -7.f);
  std::vector<Block> q(2);
  std::memset(q.data(), 0x5A, q.size() * sizeof(Block));
  EXPECT_EQ(quantize_row(x.data(), q.data(), 300).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(reinterpret_cast<const unsigned char*>(q.data())[0], 0x5A);
  EXPECT_EQ(dequantize_row(q.data(), y.data(), 257).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(y[0], -7.f);
  EXPECT_EQ(quantize_row(x.data(), q.data(), -256).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(quantize_row(nullptr, q.data(), 256).code(), StatusCode::kNullPointer);
  EXPECT_TRUE(quantize_row(x.data(), q.data(), 0).ok());
}

}  // namespace
}  // namespace encore::q4k
