// Mixture-of-experts at decode (docs/moe.md): routing and the expert Q4_K GEMVs.
//
//   moe_router   logits = W_g h (fp32 or bf16 router, fp32 accumulation), then per token the
//                parameterised top-k (sigmoid/softmax, selection-only bias, grouped selection,
//                renormalise, scale) -> expert ids [batch][k] and fp32 weights [batch][k].
//   moe_topk     the same top-k from caller-provided fp32 logits.
//   moe_experts  x[t] += sum_j w[t][j] * E_{ids[t][j]}(h[t]) + sum_s Shared_s(h[t]), with
//                E(h) = W_down (silu(W_gate h) * (W_up h)); Q4_K weights; work list built on the
//                device (graph-safe); each used expert's weights streamed once per step for up
//                to 8 of its tokens (once per pass of up to 8 when more are routed to it); a token's
//                contributions summed in ascending expert id, shared experts last: no atomics, and
//                a token's result is bitwise independent of the rest of the batch.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include <encore/q4k.h>
#include <encore/status.h>

namespace encore::ops {

inline constexpr int kMaxMoeBatch = 64;     // tokens per step (the work list tracks tokens in a 64-bit mask)
inline constexpr int kMaxMoeExperts = 512;  // routed experts (warp top-k holds E/32 scores per lane)
inline constexpr int kMaxMoeTopK = 16;
inline constexpr int kMaxMoeGroups = 32;
inline constexpr int kMaxMoeShared = 4;
inline constexpr int kMaxMoeInter = 2048;   // expert width (down projection K; 8 Q4_K blocks)

enum class MoeScoreFunc : int { kSigmoid, kSoftmax };
enum class MoeRouterDtype : int { kFp32, kBf16 };

// One parameterised routing algorithm (docs/moe.md §2). Ties go to the lower expert id.
struct MoeRoutingConfig {
  MoeScoreFunc score = MoeScoreFunc::kSigmoid;
  int num_experts = 256;
  int top_k = 8;
  int n_group = 1;        // groups of num_experts / n_group consecutive experts
  int topk_group = 1;     // groups kept (group stage runs only when n_group > 1 and topk_group < n_group)
  bool renormalize = true;
  float renorm_eps = 1e-20f;
  float routed_scale = 1.f;
  bool renormalize_top1 = true;  // false: no renormalisation when top_k == 1 (Kimi: "only if k > 1")
  // Compatibility flags (docs/moe.md §1 table; tests only, never the default):
  //   hf_remote_biased_weights : Kimi HF remote code: weights from the biased scores, dropped
  //                              groups masked with 0 instead of -inf;
  //   mask_fill_zero           : DeepSeek HF code: dropped groups masked with 0 instead of -inf;
  //   weights_to_bf16          : Qwen3 HF code: final weights rounded to bf16 (nearest even).
  bool hf_remote_biased_weights = false;
  bool mask_fill_zero = false;
  bool weights_to_bf16 = false;

  static MoeRoutingConfig deepseek_v3() { return make(MoeScoreFunc::kSigmoid, 256, 8, 8, 4, 1e-20f, 2.5f, true); }
  static MoeRoutingConfig kimi_linear() { return make(MoeScoreFunc::kSigmoid, 256, 8, 1, 1, 1e-20f, 2.446f, false); }
  static MoeRoutingConfig qwen3_moe() { return make(MoeScoreFunc::kSoftmax, 128, 8, 1, 1, 0.f, 1.f, true); }

 private:
  static MoeRoutingConfig make(MoeScoreFunc score, int e, int k, int g, int kept, float eps, float scale, bool top1) {
    MoeRoutingConfig c;
    c.score = score, c.num_experts = e, c.top_k = k, c.n_group = g, c.topk_group = kept;
    c.renorm_eps = eps, c.routed_scale = scale, c.renormalize_top1 = top1;
    return c;
  }
};

// k <= E, groups divide E, topk_group <= n_group, k <= topk_group * E / n_group, ...
Status validate_routing_config(const MoeRoutingConfig& config);

struct MoeRouterParams {
  MoeRoutingConfig config;
  const void* weight = nullptr;          // [num_experts][hidden] fp32 or bf16, 16-byte aligned
  MoeRouterDtype weight_dtype = MoeRouterDtype::kBf16;
  const float* bias = nullptr;           // optional [num_experts] e_score_correction_bias (selection only)
  const float* h = nullptr;              // [batch][hidden] normalised hidden state (raw with norm_weight), 16-byte aligned
  // Optional fused RMSNorm (the layer's ffn_norm): route rmsnorm(h) * norm_weight instead of h.
  const float* norm_weight = nullptr;    // [hidden], 16-byte aligned
  float norm_eps = 1e-5f;
  int hidden = 0;                        // a multiple of 256
  int batch = 1;                         // 1..kMaxMoeBatch
  int* topk_ids = nullptr;               // [batch][top_k], selection order (descending score)
  float* topk_weights = nullptr;         // [batch][top_k]
  float* logits = nullptr;               // optional [batch][num_experts] output
  const int* slot_ids = nullptr;         // optional [batch] (device); slot_ids[t] < 0: pad row -> ids -1, weights 0
  void* workspace = nullptr;             // moe_router_workspace_bytes(...), 16-byte aligned
  std::size_t workspace_bytes = 0;
  // Optional: one int32, zero-filled once by the caller; every call leaves it zero again. Given,
  // batches of up to kMoeRouterOnePassMaxBatch tokens run one kernel instead of two: the last block
  // to finish the logits (an integer arrival counter) routes every token, a warp each (larger
  // batches would serialise their tokens on its warps, so they keep the two kernels). Same
  // results, bit for bit. Calls that may run at the same time (other streams) need counters of
  // their own.
  std::int32_t* counter = nullptr;
};

inline constexpr int kMoeRouterOnePassMaxBatch = 8;
std::size_t moe_router_workspace_bytes(int batch, int num_experts, int hidden);
// The launcher's argument checks alone, without a device or a launch.
Status moe_router_validate(const MoeRouterParams& p);
Status moe_router(const MoeRouterParams& p, cudaStream_t stream);

struct MoeTopkParams {
  MoeRoutingConfig config;
  const float* logits = nullptr;         // [batch][num_experts]
  const float* bias = nullptr;           // optional [num_experts]
  int batch = 1;
  int* topk_ids = nullptr;               // [batch][top_k]
  float* topk_weights = nullptr;         // [batch][top_k]
  const int* slot_ids = nullptr;         // optional [batch] (device); < 0: pad row -> ids -1, weights 0
};
// The launcher's argument checks alone, without a device or a launch.
Status moe_topk_validate(const MoeTopkParams& p);
Status moe_topk(const MoeTopkParams& p, cudaStream_t stream);

struct MoeExpertsParams {
  // Expert stacks as in GGUF: (num_experts + num_shared) matrices back to back, the shared
  // experts appended after the routed ones (ids num_experts .. num_experts + num_shared - 1).
  const q4k::Block* gate = nullptr;      // [E + S][inter][hidden / 256]
  const q4k::Block* up = nullptr;        // [E + S][inter][hidden / 256]
  const q4k::Block* down = nullptr;      // [E + S][hidden][inter / 256]
  int num_experts = 0;                   // E, 1..kMaxMoeExperts
  int num_shared = 0;                    // S, 0..kMaxMoeShared (weight 1, never scaled)
  int top_k = 0;                         // 1..kMaxMoeTopK
  int hidden = 0;                        // a multiple of 256
  int inter = 0;                         // expert width, a multiple of 256, <= kMaxMoeInter
  int batch = 1;                         // 1..max_batch
  int max_batch = kMaxMoeBatch;          // what the workspace is sized for; the grids follow batch and max_batch
  const float* h = nullptr;              // [batch][hidden] normalised input (raw with norm_weight), 16-byte aligned
  // Optional fused RMSNorm: the experts see rmsnorm(h) * norm_weight. h may then be x itself
  // (the layer's input is read before anything is added to it).
  const float* norm_weight = nullptr;    // [hidden], 16-byte aligned
  float norm_eps = 1e-5f;
  float* x = nullptr;                    // [batch][hidden] residual stream, updated in place
  // Set when h was complete before the kernel that launches right before moe_experts started (as
  // when moe_router runs in between): small batches then quantise h while that kernel (the
  // routing) still runs. Leave it false when the preceding kernel writes h.
  bool h_settled = false;
  const int* topk_ids = nullptr;         // [batch][top_k] (device; e.g. from moe_router)
  const float* topk_weights = nullptr;   // [batch][top_k] (routed scale already applied)
  const int* slot_ids = nullptr;         // optional [batch] (device); slot_ids[t] < 0: pad row, no work, x[t] untouched
  void* workspace = nullptr;             // moe_experts_workspace_bytes(...), 16-byte aligned
  std::size_t workspace_bytes = 0;
  // Optional: set to a non-zero value on the device when an id is out of range or repeated within
  // a token; such a slot is skipped (nothing out of range is read). The caller clears it.
  int* error_flag = nullptr;
};

std::size_t moe_experts_workspace_bytes(int max_batch, int num_experts, int num_shared, int top_k, int hidden, int inter);

// How moe_experts runs a call of these dims (pointers are not looked at) on a device with
// `sm_count` SMs and `smem_per_block` bytes of opt-in shared memory per block (both 0: the
// current device). Small batches whose used experts give every gate/up block at most one item
// run 2 kernels that build the work list themselves; the others 3 (prepare, gate/up, down).
struct MoeExpertsPlan {
  bool in_block_list = false;  // no prepare kernel
  int blocks_per_sm = 0;       // of both stream kernels (gate/up, down)
  int gate_up_grid = 0, down_grid = 0;
  int tokens_per_pass = 0;
  int gate_up_slots = 0, down_slots = 0;  // ring buffers per warp
  bool down_row_sets = false;  // one token: down in row sets, each summed into x in-block (no combine counter)
};
Status moe_experts_plan(const MoeExpertsParams& p, MoeExpertsPlan* plan, int sm_count = 0, std::size_t smem_per_block = 0);
// The launcher's argument checks alone, without a device or a launch.
Status moe_experts_validate(const MoeExpertsParams& p);
Status moe_experts(const MoeExpertsParams& p, cudaStream_t stream);

}  // namespace encore::ops
