// The decode step as a flat table of stages (docs/model.md §4): each entry names the op to
// run and carries that op's params struct with every device pointer resolved, so the graph path can
// launch the entries in order and the megakernel can walk the same table. Built on the host from
// the config, the three arena layouts and the arenas' base pointers; nothing here touches a GPU.
//
// Granularity: one stage = one call of a public launcher (ops/*.h) or of a pipeline stage
// (stage_params.h). Per step, in order:
//   embed
//   KDA layer: in-proj (RMSNorm + Q4_K GEMV, [q|k|v|f_a|g_a|b]) -> kda -> o_proj GEMV + residual
//   MLA layer: in-proj (RMSNorm + GEMV, [q|kv_a]) [-> q_b GEMV with q LoRA] -> q_absorb, kv_append
//              (independent: the second joins the first) -> splitkv -> combine -> v_up -> o_proj
//              (+ the split-KV scheduler once per step, right after the embedding gather, joining it)
//   dense MLP: RMSNorm + gate/up GEMV (SiLU·mul) -> down GEMV + residual
//   MoE:       router (RMSNorm fused, GEMV + top-k) -> experts (RMSNorm fused, work list,
//              gate/up, down + ordered combine + residual); both read the residual stream x
//   head:      final RMSNorm + LM-head GEMV -> logits
// Kimi-Linear: 166 stages in 158 dependency levels (the scheduler joins the gather, kv_append joins
// q_absorb) up to 16 rows; above, each of the 57 Q4_K GEMV stages runs per gemv_stage_rows rows (32
// or 16: docs/model.md §4), the extra stages joining the first, the same 158 levels. The cut of the MoE
// layer differs from docs/model.md's ([norm + router + top-k + work list] [gate/up] [down]): the norm is
// fused into both MoE ops and the work list is built inside moe_experts. Graph-path kernels are
// more than stages: moe_router launches two (logits, top-k), and moe_experts two (up to 8 tokens)
// or three.
#pragma once

#include <type_traits>
#include <vector>

#include <encore/ops/kda.h>
#include <encore/ops/mla.h>
#include <encore/ops/moe.h>
#include <encore/ops/q4k_gemv.h>
#include <encore/pipeline/buffer_layout.h>
#include <encore/pipeline/stage_params.h>
#include <encore/pipeline/tensor_arena.h>

namespace encore::pipeline {

// Which params member is live, i.e. which launcher runs the stage.
enum class StageKind : int {
  kEmbed,         // embed
  kRmsNormGemv,   // rms_gemv  -> ops::rmsnorm_q4k_gemv
  kGemv,          // gemv      -> ops::q4k_gemv
  kGateUpGemv,    // gate_up   -> ops::gate_up_q4k_gemv
  kKda,           // kda       -> ops::kda
  kMlaSched,      // mla_sched -> ops::mla_sched
  kMlaQAbsorb,    // mla_q_absorb
  kMlaKvAppend,   // mla_kv_append
  kMlaSplitKv,    // mla_attention -> ops::mla_splitkv
  kMlaCombine,    // mla_attention -> ops::mla_combine
  kMlaVUp,        // mla_v_up
  kMoeRouter,     // moe_router
  kMoeExperts,    // moe_experts
};

// What the stage computes in the model (tests, traces).
enum class StageRole : int {
  kEmbed,
  kKdaInProj, kKda, kKdaOutProj,
  kMlaSched, kMlaInProj, kMlaQB, kMlaQAbsorb, kMlaKvAppend, kMlaSplitKv, kMlaCombine, kMlaVUp, kMlaOutProj,
  kDenseGateUp, kDenseDown,
  kMoeRouter, kMoeExperts,
  kLmHead,
};

union StageParams {
  EmbedParams embed;
  ops::RmsNormQ4kGemvParams rms_gemv;
  ops::Q4kGemvParams gemv;
  ops::GateUpQ4kGemvParams gate_up;
  ops::KdaParams kda;
  ops::MlaSchedParams mla_sched;
  ops::MlaQAbsorbParams mla_q_absorb;
  ops::MlaKvAppendParams mla_kv_append;
  ops::MlaAttentionParams mla_attention;
  ops::MlaVUpParams mla_v_up;
  ops::MoeRouterParams moe_router;
  ops::MoeExpertsParams moe_experts;
  StageParams() : embed{} {}
};

struct Stage {
  StageKind kind = StageKind::kEmbed;
  StageRole role = StageRole::kEmbed;
  int layer = -1;              // 0-based model layer; -1 for per-step stages (embed, scheduler, head)
  bool joins_previous = false; // reads nothing the previous stage writes (a dependency level with it;
                               // the graph path still runs the stages in order, the megakernel by data)
  ops::GemvCore gemv_core = ops::GemvCore::kAuto;  // Q4_K GEMV stages: the core both paths run
  // Q4_K GEMV stages, the graph path: the activation image's scratch (GemvLaunch::act_image,
  // ops::kGemvActImageBytes), or null; the megakernel's blocks quantise x themselves (same bits).
  void* gemv_act_image = nullptr;
  StageParams params;
};
static_assert(std::is_trivially_copyable_v<Stage>, "the stage table is copied to the device as bytes");

// Device base addresses of the three arenas (any values on the host: nothing is dereferenced).
struct ArenaBases {
  void* weights = nullptr;
  void* buffers = nullptr;
  void* state = nullptr;
};

struct StageListInputs {
  const ModelConfig* config = nullptr;
  const BufferOptions* options = nullptr;  // the options the buffer and state layouts were built with
  const TensorArena* weights = nullptr;
  const TensorArena* buffers = nullptr;
  const TensorArena* state = nullptr;
  ArenaBases bases;
  int batch = 0;  // rows per step, 1..max_batch (0: max_batch, what a captured graph uses)
};

Status build_stage_list(const StageListInputs& in, std::vector<Stage>& stages);

// The MoE op's routing parameters for a model's MoE layers.
ops::MoeRoutingConfig moe_routing(const ModelConfig& c);

// The launcher's host-side validation of the stage's params, without a GPU (kda_validate,
// mla_validate, the q4k GEMV and MoE *_validate functions, the pipeline's own stages).
Status validate_stage(const Stage& s);

// Stages that wait on their predecessor: the dependent-kernel count of docs/model.md §4.
int dependency_levels(const std::vector<Stage>& stages);

// The graph path: launches the stage through its launcher (which validates first), or every stage
// in table order, stopping at the first error (named with its index and layer); there a q
// absorption and the cache append that joins it are one launch (ops::mla_q_absorb_and_append, the
// same bits). Nothing is allocated or synchronised, so the calls can be captured into a CUDA graph.
Status run_stage(const Stage& s, cudaStream_t stream);
Status run_stages(const std::vector<Stage>& stages, cudaStream_t stream);

}  // namespace encore::pipeline
