#include <encore/pipeline/buffer_layout.h>

#include <encore/ops/kda.h>
#include <encore/ops/mla.h>
#include <encore/ops/moe.h>
#include <encore/ops/q4k_gemv.h>
#include <encore/pipeline/weight_layout.h>

namespace encore::pipeline {
namespace {

std::int64_t round_up4(std::int64_t n) { return (n + 3) / 4 * 4; }

Status add_mla_buffers(const ModelConfig& c, const BufferOptions& o, TensorArena& b) {
  const std::int64_t B = o.max_batch, G = gemv_rows(o.max_batch), H = c.mla.heads, P = o.mla_num_parts;
  ENCORE_RETURN_IF_ERROR(b.add("mla.proj", DType::kF32, {G, mla_proj_stride(c)}));
  if (c.mla.q_lora_rank > 0)
    ENCORE_RETURN_IF_ERROR(b.add("mla.q", DType::kF32, {G, H * ops::kMlaQHeadDim}));
  ENCORE_RETURN_IF_ERROR(b.add("mla.q576", DType::kBf16, {B, H, ops::kMlaRowDim}));
  ENCORE_RETURN_IF_ERROR(b.add("mla.o_lat", DType::kF32, {B, H, ops::kMlaLatentDim}));
  ENCORE_RETURN_IF_ERROR(b.add("mla.lse", DType::kF32, {B, H}));
  ENCORE_RETURN_IF_ERROR(b.add("mla.partial_o", DType::kF32, {B + P, H, ops::kMlaLatentDim}));
  ENCORE_RETURN_IF_ERROR(b.add("mla.partial_lse", DType::kF32, {B + P, H}));
  ENCORE_RETURN_IF_ERROR(b.add("mla.part_plans", DType::kI32, {P, ops::kMlaPartPlanInts}));
  ENCORE_RETURN_IF_ERROR(b.add("mla.num_splits", DType::kI32, {B + 1}));
  ENCORE_RETURN_IF_ERROR(b.add("mla.v_out", DType::kF32, {G, H * ops::kMlaVHeadDim}));
  return b.add("flags.mla", DType::kI32, {1});
}

Status add_moe_buffers(const ModelConfig& c, const BufferOptions& o, TensorArena& b) {
  const MoeConfig& e = c.moe;
  const std::int64_t router_ws = std::int64_t(ops::moe_router_workspace_bytes(o.max_batch, e.experts, c.hidden));
  const std::int64_t experts_ws = std::int64_t(
      ops::moe_experts_workspace_bytes(o.max_batch, e.experts, e.shared_experts, e.top_k, c.hidden, e.expert_width));
  ENCORE_REQUIRE(router_ws > 0 && experts_ws > 0, StatusCode::kInvalidArgument,
                 "buffers: the MoE op reports no workspace for this config");
  ENCORE_RETURN_IF_ERROR(b.add("moe.router_ws", DType::kU8, {router_ws}));
  ENCORE_RETURN_IF_ERROR(b.add("moe.topk_ids", DType::kI32, {o.max_batch, e.top_k}));
  ENCORE_RETURN_IF_ERROR(b.add("moe.topk_weights", DType::kF32, {o.max_batch, e.top_k}));
  ENCORE_RETURN_IF_ERROR(b.add("moe.experts_ws", DType::kU8, {experts_ws}));
  ENCORE_RETURN_IF_ERROR(b.add("moe.router_counter", DType::kI32, {1}));
  return b.add("flags.moe", DType::kI32, {1});
}

}  // namespace

int gemv_stage_rows(std::int64_t k, int num_matrices, ops::GemvCore core) {
  // (the wide tier runs where the launchers would take the fp16 core for kMaxGemvBatch rows)
  const bool wide = ops::q4k_gemv_core(k, ops::kMaxGemvBatch, num_matrices, core) == ops::GemvCore::kMmaF16;
  return wide ? ops::kMaxGemvBatch : kGemvStageRows;
}

std::int64_t gemv_rows(int batch) {
  return batch <= kGemvStageRows ? batch : (std::int64_t(batch) + kGemvStageRows - 1) / kGemvStageRows * kGemvStageRows;
}

std::int64_t kda_proj_stride(const ModelConfig& c) {
  const KdaConfig& k = c.kda;
  return round_up4(3LL * k.heads * k.head_dim + 2LL * k.gate_rank + k.heads);
}

std::int64_t mla_q_columns(const ModelConfig& c) {
  return c.mla.q_lora_rank > 0 ? c.mla.q_lora_rank : std::int64_t(c.mla.heads) * (c.mla.nope_dim + c.mla.rope_dim);
}

std::int64_t mla_proj_stride(const ModelConfig& c) {
  return round_up4(mla_q_columns(c) + c.mla.kv_lora_rank + c.mla.rope_dim);
}

Status validate(const BufferOptions& o) {
  ENCORE_REQUIRE(o.max_batch >= 1 && o.max_batch <= kMaxPipelineBatch, StatusCode::kOutOfRange, "buffers: max_batch must be in [1, ",
                 kMaxPipelineBatch, "] (the MoE op's limit; got ", o.max_batch, ")");
  ENCORE_REQUIRE(o.max_slots >= 1, StatusCode::kInvalidArgument, "buffers: max_slots must be >= 1");
  ENCORE_REQUIRE(o.max_pages >= 1 && o.max_pages_per_seq >= 1, StatusCode::kInvalidArgument,
                 "buffers: max_pages and max_pages_per_seq must be >= 1");
  ENCORE_REQUIRE(o.mla_num_parts >= 1 && o.mla_num_parts <= 4096, StatusCode::kInvalidArgument,
                 "buffers: mla_num_parts must be in [1, 4096] (ops::mla_num_parts(heads) on the target device; got ",
                 o.mla_num_parts, ")");
  ENCORE_REQUIRE(o.mla_min_part_units >= 1 && o.mla_min_part_units <= (1 << 16), StatusCode::kInvalidArgument,
                 "buffers: mla_min_part_units must be in [1, 2^16] (got ", o.mla_min_part_units, ")");
  ENCORE_REQUIRE(o.gemv_core == ops::GemvCore::kAuto || o.gemv_core == ops::GemvCore::kDp4a || o.gemv_core == ops::GemvCore::kMma ||
                     o.gemv_core == ops::GemvCore::kMmaF16,
                 StatusCode::kInvalidArgument, "buffers: gemv_core must be kAuto, kDp4a, kMma or kMmaF16 (got ", int(o.gemv_core), ")");
  return {};
}

Status build_buffer_layout(const ModelConfig& c, const BufferOptions& o, TensorArena& b) {
  ENCORE_RETURN_IF_ERROR(c.validate());
  ENCORE_RETURN_IF_ERROR(validate(o));
  b = TensorArena{};
  const std::int64_t B = o.max_batch, G = gemv_rows(o.max_batch);
  for (const char* name : {"step.token_ids", "step.positions", "step.seq_lens", "step.slot_ids"})
    ENCORE_RETURN_IF_ERROR(b.add(name, DType::kI32, {B}));
  ENCORE_RETURN_IF_ERROR(b.add("step.block_table", DType::kI32, {B, o.max_pages_per_seq}));
  ENCORE_RETURN_IF_ERROR(b.add("x", DType::kF32, {G, c.hidden}));
  if (c.count(Attention::kKda) > 0) {
    ENCORE_RETURN_IF_ERROR(b.add("kda.proj", DType::kF32, {G, kda_proj_stride(c)}));
    ENCORE_RETURN_IF_ERROR(b.add("kda.y", DType::kF32, {G, std::int64_t(c.kda.heads) * c.kda.head_dim}));
  }
  if (c.count(Attention::kMla) > 0) ENCORE_RETURN_IF_ERROR(add_mla_buffers(c, o, b));
  if (c.count(Mlp::kDense) > 0) ENCORE_RETURN_IF_ERROR(b.add("mlp.mid", DType::kF32, {G, c.dense_width}));
  if (c.count(Mlp::kMoe) > 0) ENCORE_RETURN_IF_ERROR(add_moe_buffers(c, o, b));
  // The graph path's GEMVs on tensor-core tiers quantise x once into this scratch (GemvLaunch::act_image).
  if (o.max_batch >= ops::kGemvMmaMinBatch)
    ENCORE_RETURN_IF_ERROR(b.add("gemv.act_image", DType::kU8, {std::int64_t(ops::kGemvActImageBytes)}));
  return b.add("logits", DType::kF32, {G, c.vocab});
}

Status build_state_layout(const ModelConfig& c, const BufferOptions& o, TensorArena& s) {
  ENCORE_RETURN_IF_ERROR(c.validate());
  ENCORE_RETURN_IF_ERROR(validate(o));
  s = TensorArena{};
  for (int l = 0; l < c.layers(); ++l) {
    if (c.attention[l] == Attention::kKda) {
      const int H = c.kda.heads, D = c.kda.head_dim;
      ENCORE_RETURN_IF_ERROR(s.add(layer_tensor(l, "kda_recurrent"), DType::kF32,
                                   {o.max_slots, ops::kda_recurrent_state_floats_per_slot(H, D)}));
      ENCORE_RETURN_IF_ERROR(
          s.add(layer_tensor(l, "kda_conv"), DType::kF32, {o.max_slots, ops::kda_conv_state_floats_per_slot(H, D)}));
    } else {
      ENCORE_RETURN_IF_ERROR(
          s.add(layer_tensor(l, "mla_cache"), DType::kBf16, {o.max_pages, ops::kMlaPageTokens, ops::kMlaRowDim}));
    }
  }
  return {};
}

}  // namespace encore::pipeline
