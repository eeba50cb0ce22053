// Params and launchers of the two stages the decode step needs that no op in ops/ provides
// (kernels in pipeline/step_kernels.cu, device bodies in pipeline/step_tiles.cuh):
//   embedding gather  x[b] = float(table[token_ids[b]])   (model.md §3; ids clamped to the vocab)
//   RMSNorm           out[b] = rmsnorm(x[b]) * gamma      (the MoE input h: moe_router and
//                     moe_experts take a normalised h and have no norm prologue)
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <encore/status.h>

namespace encore::pipeline {

struct EmbedParams {
  const __nv_bfloat16* table = nullptr;  // [vocab][hidden]
  const std::int32_t* token_ids = nullptr;  // [batch]
  float* x = nullptr;                    // [batch][hidden]
  int vocab = 0, hidden = 0, batch = 0;
};

struct RmsNormParams {
  const float* x = nullptr;      // [batch][k]
  const float* gamma = nullptr;  // [k]
  float eps = 1e-5f;
  float* out = nullptr;          // [batch][k]
  std::int64_t k = 0;
  int batch = 0;
};

// Host-side checks (dims, pointers, alignment, overlap), in the style of the ops' validators.
Status validate(const EmbedParams& p);
Status validate(const RmsNormParams& p);

// Validate, then launch one block per row (programmatic dependents of the previous kernel).
Status embed(const EmbedParams& p, cudaStream_t stream);
Status rmsnorm(const RmsNormParams& p, cudaStream_t stream);

}  // namespace encore::pipeline
