// Random Q4_K problems for the GEMV tests: weights, activations, norm weights and residuals.
#pragma once

#include <encore/q4k.h>

#include <random>
#include <vector>

#include "test_util.h"

namespace encore::test {

// Realistic Q4_K rows (the reference quantiser on Gaussian data) for small matrices; random
// bytes with finite, small d/dmin for large ones (every bit pattern of scales and codes is valid).
inline std::vector<q4k::Block> random_q4k_matrix(std::int64_t n, std::int64_t k, std::mt19937_64& rng) {
  std::vector<q4k::Block> w(std::size_t(n) * (k / 256));
  if (n * k <= (std::int64_t(1) << 21)) {
    auto values = random_normal(std::size_t(n * k), rng, 0.f, 1.f / std::sqrt(float(k)));
    EXPECT_TRUE(q4k::quantize_row(values.data(), w.data(), n * k).ok());
    return w;
  }
  auto* bytes = reinterpret_cast<std::uint8_t*>(w.data());
  for (std::size_t i = 0; i < w.size() * sizeof(q4k::Block); i += 8) {
    const std::uint64_t r = rng();
    std::memcpy(bytes + i, &r, 8);
  }
  std::uniform_real_distribution<float> d(0.2f / std::sqrt(float(k)), 1.f / std::sqrt(float(k)));
  for (auto& b : w) {
    b.d = q4k::float_to_half(d(rng) / 16.f);
    b.dmin = q4k::float_to_half(d(rng) / 8.f);
  }
  return w;
}

}  // namespace encore::test
