// fp64 CPU references of the MoE ops (docs/moe.md).
#pragma once

#include <cstdint>
#include <vector>

#include <encore/ops/moe.h>
#include <encore/q4k.h>

namespace encore::ref {

// logits[t][e] = sum_j W[e][j] h[t][j] in double; W fp32 or bf16 (raw bf16 bits as uint16).
void moe_router_logits(const void* weight, ops::MoeRouterDtype dtype, const float* h, int batch, int num_experts,
                       int hidden, double* logits);

// The MoE input the ops see when given a norm_weight: h[t] = float(rmsnorm(x[t]) * gamma), the
// norm in double (the device computes it in fp32; the two differ by about an fp32 rounding).
void moe_input_norm(const float* x, const float* gamma, int batch, int hidden, double eps, float* h);

// Routing of `batch` tokens from fp32 logits (docs/moe.md §2), scores in double. Ties (equal
// doubles) go to the lower index. ids [batch][k] in selection order, weights [batch][k]. Pad rows
// (slot_ids[t] < 0, when slot_ids is given) get ids -1 and weights 0.
void moe_topk(const ops::MoeRoutingConfig& config, const float* logits, const float* bias, int batch, int* ids,
              double* weights, const int* slot_ids = nullptr);

// Expert layer: out[t][r] = sum_j w[t][j] * E_{ids[t][j]}(h[t])[r] + sum_s Shared_s(h[t])[r]
// (the residual is not added). Weights dequantised exactly.
//   int8_activations = false: exact activations (the model's math);
//   int8_activations = true : the kernels' arithmetic in double (h and silu(g)*u quantised with
//                             ref::quantize_activations), for tight indexing checks.
// Slots whose id is out of range or repeated within the token are skipped, as on the device; pad
// rows (slot_ids[t] < 0, when slot_ids is given) get out = 0.
// ambiguity (int8 mode, optional) [batch][hidden]: per output, the most it can move when the
// device rounds an int8 code of silu(g)*u the other way (the value sits within 1e-3 code units of a
// midpoint, where fp32 and fp64 may disagree): sum of |route w * down weight| * code step. Zero
// almost everywhere; a tight comparison subtracts it per element.
void moe_experts(const q4k::Block* gate, const q4k::Block* up, const q4k::Block* down, int num_experts, int num_shared,
                 int top_k, int hidden, int inter, int batch, const float* h, const int* ids, const float* weights,
                 bool int8_activations, double* out, const int* slot_ids = nullptr, double* ambiguity = nullptr);

}  // namespace encore::ref
