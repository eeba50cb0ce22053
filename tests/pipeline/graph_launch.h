// One launch of an instantiated graph holding a decode step, as the graph tests use it.
#pragma once

#include <cstddef>
#include <vector>

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <encore/pipeline/pipeline.h>

namespace encore::pipeline {

// Launches `exec` once from a reset state, the logits poisoned first (a launch that writes none
// cannot pass), and returns the first `n` logits.
inline std::vector<float> logits_of_launch(Pipeline& p, cudaGraphExec_t exec, cudaStream_t stream, std::size_t n) {
  std::vector<float> out(n);
  EXPECT_TRUE(p.reset_state(stream).ok());
  EXPECT_EQ(cudaSuccess, cudaMemsetAsync(const_cast<float*>(p.logits()), 0xFF, n * 4, stream));
  EXPECT_EQ(cudaSuccess, cudaGraphLaunch(exec, stream));
  EXPECT_EQ(cudaSuccess, cudaStreamSynchronize(stream));
  EXPECT_EQ(cudaSuccess, cudaMemcpy(out.data(), p.logits(), n * 4, cudaMemcpyDeviceToHost));
  return out;
}

}  // namespace encore::pipeline
