// Golden check against ggml itself: encore::q4k::quantize_row must reproduce, byte for byte, what
// ggml's quantize_row_q4_K_ref wrote for a fixed set of inputs, and encore::q4k::dequantize_row
// must reproduce ggml's dequantize_row_q4_K bit for bit on those blocks. The inputs are
// regenerated here (splitmix64 + Box-Muller); ggml_golden_q4k.h holds ggml's output (data only).
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include <encore/q4k.h>

#include "ggml_golden_q4k.h"

namespace {

using encore::q4k::Block;
using encore::q4k::kBlockBytes;
using encore::q4k::kBlockValues;
namespace golden = encore::q4k::golden;

constexpr int kBlocks = golden::kGgmlGoldenBlocks;

// The generator the golden data was produced from. Do not change it without regenerating the
// header; kGgmlGoldenInputFnv catches any drift.
std::uint64_t splitmix64(std::uint64_t& s) {
  std::uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
double u01(std::uint64_t& s) { return double(splitmix64(s) >> 11) * (1.0 / 9007199254740992.0); }  // [0,1)
float gauss(std::uint64_t& s) {  // Box-Muller in double, one value per two draws, rounded to float
  double u1 = 1.0 - u01(s);
  double u2 = u01(s);
  return float(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}
float unif(std::uint64_t& s) { return float(2.0 * u01(s) - 1.0); }  // [-1,1)

// Block b (0..63): 0-11 Gaussian, 12-19 uniform [-1,1), 20-25 all positive, 26-31 all negative,
// 32-35 constant, 36-43 heavy-tailed (Gaussian cubed), 44-49 tiny (1e-6 x Gaussian),
// 50-55 huge (1e4 x Gaussian), 56-61 Gaussian with sub-block b-56 zeroed, 62-63 all zeros.
void gen_block(int b, float* x) {
  std::uint64_t s = 0x5EED0000ull + std::uint64_t(b) * 0x1000193ull;
  if (b < 12) {
    for (int i = 0; i < 256; ++i) x[i] = gauss(s);
  } else if (b < 20) {
    for (int i = 0; i < 256; ++i) x[i] = unif(s);
  } else if (b < 26) {
    for (int i = 0; i < 256; ++i) x[i] = float(0.05 + 3.0 * u01(s));
  } else if (b < 32) {
    for (int i = 0; i < 256; ++i) x[i] = float(-0.05 - 3.0 * u01(s));
  } else if (b < 36) {
    static const float c[4] = {0.75f, -2.5f, 1e-3f, 37.0f};
    for (int i = 0; i < 256; ++i) x[i] = c[b - 32];
  } else if (b < 44) {
    for (int i = 0; i < 256; ++i) {
      float g = gauss(s);
      x[i] = g * g * g;
    }
  } else if (b < 50) {
    for (int i = 0; i < 256; ++i) x[i] = gauss(s) * 1e-6f;
  } else if (b < 56) {
    for (int i = 0; i < 256; ++i) x[i] = gauss(s) * 1e4f;
  } else if (b < 62) {
    for (int i = 0; i < 256; ++i) x[i] = gauss(s);
    for (int i = 0; i < 32; ++i) x[32 * (b - 56) + i] = 0.0f;
  } else {
    for (int i = 0; i < 256; ++i) x[i] = 0.0f;
  }
}

std::vector<float> make_golden_input() {
  std::vector<float> x(std::size_t(kBlocks) * kBlockValues);
  for (int b = 0; b < kBlocks; ++b) gen_block(b, x.data() + std::size_t(b) * kBlockValues);
  return x;
}

std::uint64_t fnv1a64(const void* p, std::size_t n, std::uint64_t h = 0xCBF29CE484222325ull) {
  const auto* c = static_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < n; ++i) {
    h ^= c[i];
    h *= 0x100000001B3ull;
  }
  return h;
}

std::vector<Block> golden_blocks() {
  static_assert(sizeof(golden::kGgmlGoldenQ4K) == std::size_t(kBlocks) * kBlockBytes);
  std::vector<Block> blocks(kBlocks);
  std::memcpy(blocks.data(), golden::kGgmlGoldenQ4K, sizeof(golden::kGgmlGoldenQ4K));
  return blocks;
}

const char* field_of(int byte) {
  if (byte < 2) return "d";
  if (byte < 4) return "dmin";
  if (byte < 16) return "scales";
  return "qs";
}

TEST(Q4kGgmlGolden, InputGeneratorMatchesGolden) {
  const std::vector<float> x = make_golden_input();
  EXPECT_EQ(fnv1a64(x.data(), x.size() * sizeof(float)), golden::kGgmlGoldenInputFnv)
      << "the regenerated inputs differ from those ggml was run on (libm or generator drift); "
         "the byte comparison below is then meaningless";
}

TEST(Q4kGgmlGolden, QuantizeRowMatchesGgmlByteForByte) {
  const std::vector<float> x = make_golden_input();
  std::vector<Block> got(kBlocks);
  ASSERT_TRUE(encore::q4k::quantize_row(x.data(), got.data(), std::int64_t(x.size())).ok());
  const auto* g = reinterpret_cast<const unsigned char*>(got.data());
  const unsigned char* want = golden::kGgmlGoldenQ4K;
  int bad_blocks = 0;
  for (int b = 0; b < kBlocks; ++b) {
    const unsigned char* gb = g + std::size_t(b) * kBlockBytes;
    const unsigned char* wb = want + std::size_t(b) * kBlockBytes;
    if (std::memcmp(gb, wb, kBlockBytes) == 0) continue;
    int first = 0;
    while (gb[first] == wb[first]) ++first;
    int ndiff = 0;
    for (int i = 0; i < kBlockBytes; ++i) ndiff += gb[i] != wb[i];
    ADD_FAILURE() << "block " << b << ": first differing byte " << first << " (" << field_of(first)
                  << "): encore 0x" << std::hex << int(gb[first]) << " vs ggml 0x" << int(wb[first])
                  << std::dec << "; " << ndiff << " of 144 bytes differ";
    ++bad_blocks;
  }
  EXPECT_EQ(bad_blocks, 0) << "blocks differing from ggml's quantize_row_q4_K_ref";
}

TEST(Q4kGgmlGolden, DequantizeRowMatchesGgmlBitForBit) {
  const std::vector<Block> blocks = golden_blocks();
  std::vector<float> y(std::size_t(kBlocks) * kBlockValues);
  ASSERT_TRUE(encore::q4k::dequantize_row(blocks.data(), y.data(), std::int64_t(y.size())).ok());
  for (int b = 0; b < kBlocks; ++b)
    EXPECT_EQ(fnv1a64(y.data() + std::size_t(b) * kBlockValues, kBlockValues * sizeof(float)),
              golden::kGgmlGoldenDequantBlockFnv[b])
        << "block " << b << " decodes differently from ggml's dequantize_row_q4_K";
  EXPECT_EQ(fnv1a64(y.data(), y.size() * sizeof(float)), golden::kGgmlGoldenDequantFnv);
}

}  // namespace
