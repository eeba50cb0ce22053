// Inputs shared by the MoE tests: random Q4_K expert stacks and random routings.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include <encore/q4k.h>

namespace encore::test {

// `count` random Q4_K blocks: random scales, mins and codes; d in [2e-4, 4e-4], dmin in
// [1e-4, 2e-4] (so weights stay O(0.1)). Random bytes exercise every scale/nibble pattern.
inline std::vector<q4k::Block> random_q4k_blocks(std::size_t count, std::mt19937_64& rng) {
  std::vector<q4k::Block> blocks(count);
  auto* bytes = reinterpret_cast<unsigned char*>(blocks.data());
  const std::size_t n = count * sizeof(q4k::Block);
  for (std::size_t i = 0; i + 8 <= n; i += 8) {
    const std::uint64_t r = rng();
    std::memcpy(bytes + i, &r, 8);
  }
  std::uniform_real_distribution<float> d(2e-4f, 4e-4f), dmin(1e-4f, 2e-4f);
  for (auto& b : blocks) {
    b.d = q4k::float_to_half(d(rng));
    b.dmin = q4k::float_to_half(dmin(rng));
  }
  return blocks;
}

// Distinct random expert ids per token (uniform routing) and positive weights.
inline void random_routing(int batch, int num_experts, int top_k, std::mt19937_64& rng, std::vector<int>& ids,
                           std::vector<float>& weights) {
  ids.resize(std::size_t(batch) * top_k);
  weights.resize(ids.size());
  std::vector<int> perm(num_experts);
  std::uniform_real_distribution<float> w(0.05f, 0.5f);
  for (int t = 0; t < batch; ++t) {
    std::iota(perm.begin(), perm.end(), 0);
    for (int j = 0; j < top_k; ++j) {
      std::uniform_int_distribution<int> pick(j, num_experts - 1);
      std::swap(perm[j], perm[pick(rng)]);
      ids[t * top_k + j] = perm[j];
      weights[t * top_k + j] = w(rng);
    }
  }
}

}  // namespace encore::test
