// Params and launcher of the one stage the decode step needs that no op in ops/ provides (kernel
// in pipeline/step_kernels.cu, device body in pipeline/step_tiles.cuh):
//   embedding gather  x[b] = float(table[token_ids[b]])   (docs/model.md §3; ids clamped to the vocab)
// Every RMSNorm of the step is fused into the op that consumes it (the GEMVs, moe_router and
// moe_experts through their norm weights).
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <encore/ops/mla.h>
#include <encore/status.h>

namespace encore::pipeline {

struct EmbedParams {
  const __nv_bfloat16* table = nullptr;  // [vocab][hidden]
  const std::int32_t* token_ids = nullptr;  // [batch]
  float* x = nullptr;                    // [batch][hidden]
  int vocab = 0, hidden = 0, batch = 0;
};

// Host-side checks (dims, pointers, alignment, overlap), in the style of the ops' validators.
Status validate(const EmbedParams& p);

// Validate, then launch one block per row (programmatic dependents of the previous kernel).
Status embed(const EmbedParams& p, cudaStream_t stream);
// The gather and the MLA split-KV scheduler in one launch (both read only the step's inputs; one
// more block plans while the others gather): the same outputs as embed then ops::mla_sched.
Status embed_and_mla_sched(const EmbedParams& e, const ops::MlaSchedParams& s, cudaStream_t stream);

}  // namespace encore::pipeline
