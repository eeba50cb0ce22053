// Synthetic weights for tests and benchmarks (docs/model.md §6 distributions), generated
// on the device from a seed (or on the host, fill_random_weights_host): every tensor of a weight layout, so a whole Kimi-Linear-sized model
// (~28 GB) fills in milliseconds and two fills with one seed are bit-identical.
//   Q4_K            random codes and 6-bit scales / mins; d = 1 / (256 sqrt(K)), dmin = 7.5 d, so
//                   weights are ~zero-mean with a spread ~1 / sqrt(K)
//   *norm.weight    1 + U(-0.17, 0.17)            (std 0.1)
//   ssm_conv1d_*    U(-0.87, 0.87)                (std 0.5)
//   ssm_a_log       ln U(1, 16)
//   ssm_dt.bias     softplus^-1(dt), dt log-uniform in [1e-3, 1e-1]
//   exp_probs_b     U(-0.5, 0.5)                  (the selection bias changes selections)
//   token_embd      U(-1.73, 1.73)                (std 1)
//   other bf16/fp32 U(-a, a), a = sqrt(3 / last dim)   (std 1 / sqrt(fan-in): unit-scale outputs)
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include <encore/pipeline/tensor_arena.h>
#include <encore/status.h>

namespace encore::pipeline {

// Fills every tensor of `layout` at device base `base` (16-byte aligned); asynchronous on `stream`.
Status fill_random_weights(const TensorArena& layout, void* base, std::uint64_t seed, cudaStream_t stream);

// The same distributions drawn on the host into `host_base` (layout.total_bytes() bytes), e.g. for
// a model file written with save_gguf (the values differ from the device fill's).
void fill_random_weights_host(const TensorArena& layout, void* host_base, std::uint64_t seed);

}  // namespace encore::pipeline
