// The token sequence both sides of the llama.cpp agreement run feed, one per step.
#pragma once

#include <cstdint>

namespace agree {

inline int token(std::uint64_t seed, int step, int vocab) {
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + std::uint64_t(step + 1) * 0xBF58476D1CE4E5B9ull;
  x ^= x >> 31;
  return int(x % std::uint64_t(vocab));
}

}  // namespace agree
