// CPU reference of greedy decoding (include/encore/ops/sample.h): the same rules on host arrays.
#pragma once

#include <cstdint>

#include <encore/ops/sample.h>

namespace encore::ref {

// The argmax of n logits, NaN counted as -inf, ties to the lowest index.
std::int32_t greedy_argmax(const float* logits, int n);

// One greedy_next on host copies of its arrays: p's pointers are host pointers here (workspace
// and flags unused but *flags is ORed like the device's). Returns the SampleError bits it set.
int greedy_next(const ops::GreedyParams& p);

}  // namespace encore::ref
