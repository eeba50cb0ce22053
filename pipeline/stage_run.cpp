// The graph path's executor: each stage is one call of its launcher, in table order, except two
// pairs whose second stage joins the first, each run as one launch (in one stream the second would
// otherwise wait for the first): the gather and the MLA scheduler (embed_and_mla_sched), a q
// absorption and its cache append (mla_q_absorb_and_append). The launchers validate before
// launching and neither allocate nor synchronise, so a whole run can be captured into a CUDA graph
// (graphs/decode_graph.cpp).
#include <string>

#include <encore/pipeline/stage_list.h>

namespace encore::pipeline {

Status run_stage(const Stage& s, cudaStream_t stream) {
  const StageParams& p = s.params;
  const ops::GemvLaunch gemv{true, s.gemv_core, 0, s.gemv_act_image, s.gemv_act_image ? ops::kGemvActImageBytes : 0};
  switch (s.kind) {
    case StageKind::kEmbed: return embed(p.embed, stream);
    case StageKind::kRmsNormGemv: return ops::rmsnorm_q4k_gemv(p.rms_gemv, stream, gemv);
    case StageKind::kGemv: return ops::q4k_gemv(p.gemv, stream, gemv);
    case StageKind::kGateUpGemv: return ops::gate_up_q4k_gemv(p.gate_up, stream, gemv);
    case StageKind::kKda: return ops::kda(p.kda, stream);
    case StageKind::kMlaSched: return ops::mla_sched(p.mla_sched, stream);
    case StageKind::kMlaQAbsorb: return ops::mla_q_absorb(p.mla_q_absorb, stream);
    case StageKind::kMlaKvAppend: return ops::mla_kv_append(p.mla_kv_append, stream);
    case StageKind::kMlaSplitKv: return ops::mla_splitkv(p.mla_attention, stream);
    case StageKind::kMlaCombine: return ops::mla_combine(p.mla_attention, stream);
    case StageKind::kMlaVUp: return ops::mla_v_up(p.mla_v_up, stream);
    case StageKind::kMoeRouter: return ops::moe_router(p.moe_router, stream);
    case StageKind::kMoeExperts: return ops::moe_experts(p.moe_experts, stream);
  }
  return Status(StatusCode::kInvalidArgument, "stage: unknown kind");
}

Status run_stages(const std::vector<Stage>& stages, cudaStream_t stream) {
  for (std::size_t i = 0; i < stages.size(); ++i) {
    const Stage* next = i + 1 < stages.size() && stages[i + 1].joins_previous ? &stages[i + 1] : nullptr;
    const bool absorb_and_append = stages[i].kind == StageKind::kMlaQAbsorb && next && next->kind == StageKind::kMlaKvAppend;
    const bool embed_and_sched = stages[i].kind == StageKind::kEmbed && next && next->kind == StageKind::kMlaSched;
    const Status s = absorb_and_append ? ops::mla_q_absorb_and_append(stages[i].params.mla_q_absorb, next->params.mla_kv_append, stream)
                     : embed_and_sched ? embed_and_mla_sched(stages[i].params.embed, next->params.mla_sched, stream)
                                       : run_stage(stages[i], stream);
    if (!s.ok())
      return Status(s.code(), "stage " + std::to_string(i) + " (layer " + std::to_string(stages[i].layer) + "): " + s.message());
    i += absorb_and_append || embed_and_sched;
  }
  return {};
}

}  // namespace encore::pipeline
