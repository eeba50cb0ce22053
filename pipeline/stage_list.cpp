#include <encore/pipeline/stage_list.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

#include <encore/pipeline/weight_layout.h>

namespace encore::pipeline {
namespace {

// Resolves names to device pointers and appends stages. Lookups throw encore::Error (a missing
// tensor is a layout bug); build_stage_list turns that into a Status.
class Builder {
 public:
  Builder(const StageListInputs& in, std::vector<Stage>& out)
      : in_(in), c_(*in.config), o_(*in.options), B_(in.batch ? in.batch : in.options->max_batch), out_(out),
        act_image_(B_ >= ops::kGemvMmaMinBatch ? buffer<void>("gemv.act_image") : nullptr) {}

  void build() {
    push(StageKind::kEmbed, StageRole::kEmbed, -1, &StageParams::embed) =
        EmbedParams{weight<__nv_bfloat16>("token_embd.weight"), buffer<std::int32_t>("step.token_ids"), buffer<float>("x"),
                    c_.vocab, c_.hidden, B_};
    // The split-KV plan, once per step for every MLA layer: it reads only the step's inputs, so it
    // joins the gather (the graph path runs both in one launch).
    for (int l = 0; l < c_.layers(); ++l)
      if (c_.attention[l] == Attention::kMla) {
        mla_sched(l);
        break;
      }
    for (int l = 0; l < c_.layers(); ++l) {
      if (c_.attention[l] == Attention::kKda)
        kda_layer(l);
      else
        mla_layer(l);
      c_.mlp[l] == Mlp::kDense ? dense_mlp(l) : moe(l);
    }
    push_gemv(StageKind::kRmsNormGemv, StageRole::kLmHead, -1, &StageParams::rms_gemv,
              norm_gemv(weight<q4k::Block>("output.weight"), weight<float>("output_norm.weight"), buffer<float>("x"),
                        buffer<float>("logits"), c_.vocab, c_.hidden));
  }

 private:
  template <class T>
  T* at(const TensorArena& arena, void* base, const std::string& name) const {
    const TensorInfo* t = nullptr;
    throw_if_error(arena.lookup(name, t));
    return reinterpret_cast<T*>(reinterpret_cast<std::uintptr_t>(base) + std::uintptr_t(t->offset));
  }
  template <class T> const T* weight(const std::string& name) const { return at<T>(*in_.weights, in_.bases.weights, name); }
  template <class T> const T* weight(int l, const char* base) const { return weight<T>(layer_tensor(l, base)); }
  template <class T> T* buffer(const std::string& name) const { return at<T>(*in_.buffers, in_.bases.buffers, name); }
  std::size_t buffer_bytes(const std::string& name) const {
    const TensorInfo* t = nullptr;
    throw_if_error(in_.buffers->lookup(name, t));
    return std::size_t(t->bytes);
  }
  template <class T> T* state(int l, const char* base) const { return at<T>(*in_.state, in_.bases.state, layer_tensor(l, base)); }

  // Appends a stage whose live params member is `member`, value-initialised (the ops' defaults)
  // over zeroed bytes, so the table's bytes are deterministic.
  template <class P>
  P& push(StageKind kind, StageRole role, int layer, P StageParams::*member, bool joins_previous = false) {
    Stage s;
    std::memset(static_cast<void*>(&s), 0, sizeof(s));
    s.params.*member = P{};
    s.kind = kind, s.role = role, s.layer = layer, s.joins_previous = joins_previous;
    s.gemv_core = o_.gemv_core;
    s.gemv_act_image = act_image_;
    out_.push_back(s);
    return out_.back().params.*member;
  }

  // A Q4_K GEMV stage over the step's B rows: one stage up to kGemvStageRows rows, else stages of
  // gemv_stage_rows (32 where the fp16 core's wide tier takes this K, else 16), the last one
  // possibly of 16, each running all of its rows (the GEMV buffers have gemv_rows(max_batch) rows,
  // a multiple of 16; the rows past B are pad rows). Later stages join the first: other rows, the
  // same weights.
  template <class P>
  void push_gemv(StageKind kind, StageRole role, int layer, P StageParams::*member, const P& whole) {
    if (B_ <= kGemvStageRows) {
      push(kind, role, layer, member) = whole;
      return;
    }
    const int rows = int(gemv_rows(B_)), per_stage = gemv_stage_rows(whole.k, matrices_of(whole), o_.gemv_core);
    for (int first = 0; first < rows; first += per_stage) {
      P p = whole;
      p.batch = std::min(per_stage, rows - first);
      offset_rows(p, first);
      push(kind, role, layer, member, first > 0) = p;
    }
  }
  static int matrices_of(const ops::Q4kGemvParams&) { return 1; }
  static int matrices_of(const ops::RmsNormQ4kGemvParams&) { return 1; }
  static int matrices_of(const ops::GateUpQ4kGemvParams&) { return 2; }
  static std::int64_t or_default(std::int64_t stride, std::int64_t dim) { return stride ? stride : dim; }
  static void offset_rows(ops::Q4kGemvParams& p, int rows) {
    const std::int64_t y = rows * or_default(p.y_stride, p.n);
    p.x += rows * or_default(p.x_stride, p.k), p.y += y;
    if (p.residual) p.residual += y;
  }
  static void offset_rows(ops::RmsNormQ4kGemvParams& p, int rows) {
    const std::int64_t y = rows * or_default(p.y_stride, p.n);
    p.x += rows * or_default(p.x_stride, p.k), p.y += y;
    if (p.residual) p.residual += y;
    if (p.normalized) p.normalized += rows * p.k;
  }
  static void offset_rows(ops::GateUpQ4kGemvParams& p, int rows) {
    const std::int64_t h = rows * or_default(p.h_stride, p.n);
    p.x += rows * or_default(p.x_stride, p.k), p.h += h;
    if (p.up_out) p.up_out += h;
  }

  ops::RmsNormQ4kGemvParams norm_gemv(const q4k::Block* w, const float* gamma, const float* x, float* y, std::int64_t n,
                                      std::int64_t k, std::int64_t x_stride = 0, std::int64_t y_stride = 0) const {
    ops::RmsNormQ4kGemvParams p;
    p.weight = w, p.x = x, p.gamma = gamma, p.eps = c_.rms_eps, p.y = y, p.n = n, p.k = k, p.batch = B_;
    p.x_stride = x_stride, p.y_stride = y_stride;
    return p;
  }
  // y = x += W in (the o_proj / down projections: residual add in place).
  void residual_gemv(StageRole role, int l, const char* w, const float* in, std::int64_t k) {
    ops::Q4kGemvParams p;
    p.weight = weight<q4k::Block>(l, w), p.x = in, p.y = buffer<float>("x"), p.residual = p.y;
    p.n = c_.hidden, p.k = k, p.batch = B_;
    push_gemv(StageKind::kGemv, role, l, &StageParams::gemv, p);
  }

  void kda_layer(int l) {
    const KdaConfig& k = c_.kda;
    const std::int64_t P = std::int64_t(k.heads) * k.head_dim;
    push_gemv(StageKind::kRmsNormGemv, StageRole::kKdaInProj, l, &StageParams::rms_gemv,
              norm_gemv(weight<q4k::Block>(l, "attn_q.weight"), weight<float>(l, "attn_norm.weight"), buffer<float>("x"),
                        buffer<float>("kda.proj"), 3 * P + 2 * k.gate_rank + k.heads, c_.hidden, 0, kda_proj_stride(c_)));
    ops::KdaParams& p = push(StageKind::kKda, StageRole::kKda, l, &StageParams::kda);
    p.proj = buffer<float>("kda.proj"), p.proj_stride = kda_proj_stride(c_);
    p.slot_ids = buffer<int>("step.slot_ids"), p.y = buffer<float>("kda.y");
    p.conv_weight = weight<float>(l, "ssm_conv1d_q.weight"), p.A_log = weight<float>(l, "ssm_a_log");
    p.dt_bias = weight<float>(l, "ssm_dt.bias");
    p.f_b_weight = weight<__nv_bfloat16>(l, "ssm_f_b.weight"), p.g_b_weight = weight<__nv_bfloat16>(l, "ssm_g_b.weight");
    p.o_norm_weight = weight<float>(l, "ssm_norm.weight");
    p.conv_state = state<float>(l, "kda_conv"), p.recurrent_state = state<float>(l, "kda_recurrent");
    p.batch = B_, p.num_heads = k.heads, p.head_dim = k.head_dim, p.gate_rank = k.gate_rank, p.num_slots = o_.max_slots;
    p.norm_eps = c_.rms_eps;
    p.state_settled = true;  // the in-projection runs between the step's slot ids / the last step and the op
    residual_gemv(StageRole::kKdaOutProj, l, "attn_output.weight", buffer<float>("kda.y"), P);
  }

  ops::MlaPagedCache cache(int l) const {
    ops::MlaPagedCache m;
    m.pages = state<__nv_bfloat16>(l, "mla_cache"), m.num_pages = o_.max_pages;
    m.block_table = buffer<std::int32_t>("step.block_table");
    m.block_table_stride = m.max_pages_per_seq = o_.max_pages_per_seq;
    return m;
  }
  ops::MlaRope rope() const { return c_.mla.nope ? ops::mla_rope_none() : ops::mla_rope_deepseek_v3(); }

  void mla_sched(int l) {
    ops::MlaSchedParams& p = push(StageKind::kMlaSched, StageRole::kMlaSched, -1, &StageParams::mla_sched, true);
    p.seq_lens = buffer<std::int32_t>("step.seq_lens"), p.positions = buffer<std::int32_t>("step.positions");
    p.cache = cache(l), p.batch = B_, p.num_parts = o_.mla_num_parts, p.min_part_units = o_.mla_min_part_units;
    p.part_plans = buffer<ops::MlaPartPlan>("mla.part_plans"), p.num_splits = buffer<std::int32_t>("mla.num_splits");
    p.error_flag = buffer<std::int32_t>("flags.mla");
  }

  void mla_layer(int l) {
    const MlaConfig& m = c_.mla;
    const std::int64_t stride = mla_proj_stride(c_), q_cols = mla_q_columns(c_), q_width = std::int64_t(m.heads) * ops::kMlaQHeadDim;
    float* proj = buffer<float>("mla.proj");
    const bool lora = m.q_lora_rank > 0;
    push_gemv(StageKind::kRmsNormGemv, StageRole::kMlaInProj, l, &StageParams::rms_gemv,
              norm_gemv(weight<q4k::Block>(l, lora ? "attn_q_a.weight" : "attn_q.weight"), weight<float>(l, "attn_norm.weight"),
                        buffer<float>("x"), proj, q_cols + m.kv_lora_rank + m.rope_dim, c_.hidden, 0, stride));
    if (lora)
      push_gemv(StageKind::kRmsNormGemv, StageRole::kMlaQB, l, &StageParams::rms_gemv,
                norm_gemv(weight<q4k::Block>(l, "attn_q_b.weight"), weight<float>(l, "attn_q_a_norm.weight"), proj,
                          buffer<float>("mla.q"), q_width, m.q_lora_rank, stride, 0));
    const __nv_bfloat16* kv_b = weight<__nv_bfloat16>(l, "attn_kv_b.weight");
    __nv_bfloat16* q576 = buffer<__nv_bfloat16>("mla.q576");

    ops::MlaQAbsorbParams& q = push(StageKind::kMlaQAbsorb, StageRole::kMlaQAbsorb, l, &StageParams::mla_q_absorb);
    q.q = lora ? buffer<float>("mla.q") : proj, q.q_stride = lora ? q_width : stride;
    q.kv_b = kv_b, q.positions = buffer<std::int32_t>("step.positions"), q.batch = B_, q.num_heads = m.heads;
    q.rope = rope(), q.q576 = q576;

    ops::MlaKvAppendParams& a = push(StageKind::kMlaKvAppend, StageRole::kMlaKvAppend, l, &StageParams::mla_kv_append, true);
    a.kv_a = proj + q_cols, a.kv_a_stride = stride, a.norm_weight = weight<float>(l, "attn_kv_a_norm.weight");
    a.eps = c_.rms_eps, a.positions = buffer<std::int32_t>("step.positions"), a.seq_lens = buffer<std::int32_t>("step.seq_lens");
    a.cache = cache(l), a.batch = B_, a.rope = rope(), a.error_flag = buffer<std::int32_t>("flags.mla");

    ops::MlaAttentionParams t;
    t.q576 = q576, t.cache = cache(l), t.seq_lens = buffer<std::int32_t>("step.seq_lens");
    t.part_plans = buffer<ops::MlaPartPlan>("mla.part_plans"), t.num_splits = buffer<std::int32_t>("mla.num_splits");
    t.error_flag = buffer<std::int32_t>("flags.mla"), t.batch = B_, t.num_heads = m.heads, t.num_parts = o_.mla_num_parts;
    t.softmax_scale = m.softmax_scale, t.o_lat = buffer<float>("mla.o_lat"), t.lse = buffer<float>("mla.lse");
    t.partial_o = buffer<float>("mla.partial_o"), t.partial_lse = buffer<float>("mla.partial_lse");
    t.plan_settled = true;  // mla_sched and the step inputs ran first; only the append's rows are new
    push(StageKind::kMlaSplitKv, StageRole::kMlaSplitKv, l, &StageParams::mla_attention) = t;
    push(StageKind::kMlaCombine, StageRole::kMlaCombine, l, &StageParams::mla_attention) = t;

    ops::MlaVUpParams& v = push(StageKind::kMlaVUp, StageRole::kMlaVUp, l, &StageParams::mla_v_up);
    v.o_lat = t.o_lat, v.kv_b = kv_b, v.batch = B_, v.num_heads = m.heads, v.out = buffer<float>("mla.v_out");
    residual_gemv(StageRole::kMlaOutProj, l, "attn_output.weight", v.out, std::int64_t(m.heads) * m.v_dim);
  }

  void dense_mlp(int l) {
    ops::GateUpQ4kGemvParams g;
    g.gate = weight<q4k::Block>(l, "ffn_gate.weight"), g.up = weight<q4k::Block>(l, "ffn_up.weight");
    g.x = buffer<float>("x"), g.gamma = weight<float>(l, "ffn_norm.weight"), g.eps = c_.rms_eps;
    g.output = ops::GateUpOutput::kSiluMul, g.h = buffer<float>("mlp.mid");
    g.n = c_.dense_width, g.k = c_.hidden, g.batch = B_;
    push_gemv(StageKind::kGateUpGemv, StageRole::kDenseGateUp, l, &StageParams::gate_up, g);
    residual_gemv(StageRole::kDenseDown, l, "ffn_down.weight", g.h, c_.dense_width);
  }

  ops::MoeRoutingConfig routing() const { return moe_routing(c_); }

  // The pushes below can move earlier stages (vector growth): shared pointers live in locals.
  void moe(int l) {
    const MoeConfig& e = c_.moe;
    float* x = buffer<float>("x");
    const float* norm = weight<float>(l, "ffn_norm.weight");
    int* ids = buffer<int>("moe.topk_ids");
    float* weights = buffer<float>("moe.topk_weights");
    const int* slot_ids = buffer<int>("step.slot_ids");
    // The layer's RMSNorm is fused into both ops: they read the residual stream x itself.
    ops::MoeRouterParams& r = push(StageKind::kMoeRouter, StageRole::kMoeRouter, l, &StageParams::moe_router);
    r.config = routing(), r.weight = weight<__nv_bfloat16>(l, "ffn_gate_inp.weight"), r.weight_dtype = ops::MoeRouterDtype::kBf16;
    r.bias = e.selection_bias ? weight<float>(l, "exp_probs_b.bias") : nullptr;
    r.h = x, r.norm_weight = norm, r.norm_eps = c_.rms_eps, r.hidden = c_.hidden, r.batch = B_, r.topk_ids = ids, r.topk_weights = weights, r.slot_ids = slot_ids;
    r.workspace = buffer<void>("moe.router_ws"), r.workspace_bytes = buffer_bytes("moe.router_ws");
    // One token: one kernel, its last block routing (an arrival counter), a kernel boundary fewer
    // than the GEMV and the top-k apart; more tokens would queue on that block's warps.
    if (B_ == 1) r.counter = buffer<std::int32_t>("moe.router_counter");

    ops::MoeExpertsParams& m = push(StageKind::kMoeExperts, StageRole::kMoeExperts, l, &StageParams::moe_experts);
    m.gate = weight<q4k::Block>(l, "ffn_gate_exps.weight"), m.up = weight<q4k::Block>(l, "ffn_up_exps.weight");
    m.down = weight<q4k::Block>(l, "ffn_down_exps.weight");
    m.num_experts = e.experts, m.num_shared = e.shared_experts, m.top_k = e.top_k;
    m.hidden = c_.hidden, m.inter = e.expert_width, m.batch = B_, m.max_batch = o_.max_batch;
    m.h = x, m.norm_weight = norm, m.norm_eps = c_.rms_eps, m.x = x, m.topk_ids = ids, m.topk_weights = weights, m.slot_ids = slot_ids;
    m.h_settled = true;  // the router runs between x's last writer and the experts
    m.workspace = buffer<void>("moe.experts_ws"), m.workspace_bytes = buffer_bytes("moe.experts_ws");
    m.error_flag = buffer<int>("flags.moe");
  }

  const StageListInputs& in_;
  const ModelConfig& c_;
  const BufferOptions& o_;
  const int B_;
  std::vector<Stage>& out_;
  void* const act_image_;  // Stage::gemv_act_image
};

}  // namespace

ops::MoeRoutingConfig moe_routing(const ModelConfig& c) {
  const MoeConfig& e = c.moe;
  ops::MoeRoutingConfig r = ops::MoeRoutingConfig::kimi_linear();
  r.score = e.score == RouterScore::kSigmoid ? ops::MoeScoreFunc::kSigmoid : ops::MoeScoreFunc::kSoftmax;
  r.num_experts = e.experts, r.top_k = e.top_k, r.n_group = e.groups, r.topk_group = e.kept_groups;
  r.renormalize = e.renormalise, r.routed_scale = e.routed_scale;
  return r;
}

Status build_stage_list(const StageListInputs& in, std::vector<Stage>& stages) {
  ENCORE_REQUIRE(in.config && in.options && in.weights && in.buffers && in.state, StatusCode::kNullPointer,
                 "stage list: config, options and the three layouts are required");
  ENCORE_REQUIRE(in.bases.weights && in.bases.buffers && in.bases.state, StatusCode::kNullPointer,
                 "stage list: every arena base pointer is required");
  ENCORE_RETURN_IF_ERROR(in.config->validate());
  ENCORE_RETURN_IF_ERROR(validate(*in.options));
  ENCORE_REQUIRE(in.batch >= 0 && in.batch <= in.options->max_batch, StatusCode::kOutOfRange, "stage list: batch ", in.batch,
                 " exceeds max_batch ", in.options->max_batch);
  stages.clear();
  try {
    Builder(in, stages).build();
  } catch (const Error& e) {
    stages.clear();
    return Status(e.code(), e.what());
  }
  return {};
}

Status validate_stage(const Stage& s) {
  const StageParams& p = s.params;
  switch (s.kind) {
    case StageKind::kEmbed: return validate(p.embed);
    case StageKind::kKda: return ops::kda_validate(p.kda);
    case StageKind::kMlaSched: return ops::mla_validate(p.mla_sched);
    case StageKind::kMlaQAbsorb: return ops::mla_validate(p.mla_q_absorb);
    case StageKind::kMlaKvAppend: return ops::mla_validate(p.mla_kv_append);
    case StageKind::kMlaSplitKv:
    case StageKind::kMlaCombine: return ops::mla_validate(p.mla_attention);
    case StageKind::kMlaVUp: return ops::mla_validate(p.mla_v_up);
    case StageKind::kMoeRouter: return ops::moe_router_validate(p.moe_router);
    case StageKind::kMoeExperts: return ops::moe_experts_validate(p.moe_experts);
    case StageKind::kRmsNormGemv: return ops::rmsnorm_q4k_gemv_validate(p.rms_gemv);
    case StageKind::kGemv: return ops::q4k_gemv_validate(p.gemv);
    case StageKind::kGateUpGemv: return ops::gate_up_q4k_gemv_validate(p.gate_up);
  }
  return Status(StatusCode::kInvalidArgument, "stage: unknown kind");
}

int dependency_levels(const std::vector<Stage>& stages) {
  int levels = 0;
  for (const Stage& s : stages) levels += s.joins_previous ? 0 : 1;
  return levels;
}

}  // namespace encore::pipeline
