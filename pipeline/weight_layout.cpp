#include <encore/pipeline/weight_layout.h>

namespace encore::pipeline {
namespace {

using Dims = std::vector<std::int64_t>;

// Adds the tensors of one layer under "blk.<layer>.".
struct LayerAdder {
  TensorArena& arena;
  int layer;
  Status operator()(const char* base, DType t, Dims dims, bool follows_previous = false) const {
    return arena.add(layer_tensor(layer, base), t, std::move(dims), follows_previous);
  }
};

Status add_kda(const ModelConfig& c, const LayerAdder& add) {
  const std::int64_t d = c.hidden, H = c.kda.heads, D = c.kda.head_dim, P = H * D, R = c.kda.gate_rank;
  ENCORE_RETURN_IF_ERROR(add("attn_q.weight", DType::kQ4K, {P, d}));
  ENCORE_RETURN_IF_ERROR(add("attn_k.weight", DType::kQ4K, {P, d}, true));
  ENCORE_RETURN_IF_ERROR(add("attn_v.weight", DType::kQ4K, {P, d}, true));
  ENCORE_RETURN_IF_ERROR(add("ssm_f_a.weight", DType::kQ4K, {R, d}, true));
  ENCORE_RETURN_IF_ERROR(add("ssm_g_a.weight", DType::kQ4K, {R, d}, true));
  ENCORE_RETURN_IF_ERROR(add("ssm_beta.weight", DType::kQ4K, {H, d}, true));
  ENCORE_RETURN_IF_ERROR(add("ssm_conv1d_q.weight", DType::kF32, {P, c.kda.conv_kernel}));
  ENCORE_RETURN_IF_ERROR(add("ssm_conv1d_k.weight", DType::kF32, {P, c.kda.conv_kernel}, true));
  ENCORE_RETURN_IF_ERROR(add("ssm_conv1d_v.weight", DType::kF32, {P, c.kda.conv_kernel}, true));
  ENCORE_RETURN_IF_ERROR(add("ssm_a_log", DType::kF32, {H}));
  ENCORE_RETURN_IF_ERROR(add("ssm_dt.bias", DType::kF32, {P}));
  ENCORE_RETURN_IF_ERROR(add("ssm_f_b.weight", DType::kBf16, {P, R}));
  ENCORE_RETURN_IF_ERROR(add("ssm_g_b.weight", DType::kBf16, {P, R}));
  ENCORE_RETURN_IF_ERROR(add("ssm_norm.weight", DType::kF32, {D}));
  return add("attn_output.weight", DType::kQ4K, {d, P});
}

Status add_mla(const ModelConfig& c, const LayerAdder& add) {
  const MlaConfig& m = c.mla;
  const std::int64_t d = c.hidden, q_width = std::int64_t(m.heads) * (m.nope_dim + m.rope_dim);
  if (m.q_lora_rank == 0) {
    ENCORE_RETURN_IF_ERROR(add("attn_q.weight", DType::kQ4K, {q_width, d}));
  } else {
    ENCORE_RETURN_IF_ERROR(add("attn_q_a.weight", DType::kQ4K, {m.q_lora_rank, d}));
  }
  ENCORE_RETURN_IF_ERROR(add("attn_kv_a_mqa.weight", DType::kQ4K, {m.kv_lora_rank + m.rope_dim, d}, true));
  if (m.q_lora_rank > 0) {
    ENCORE_RETURN_IF_ERROR(add("attn_q_a_norm.weight", DType::kF32, {m.q_lora_rank}));
    ENCORE_RETURN_IF_ERROR(add("attn_q_b.weight", DType::kQ4K, {q_width, m.q_lora_rank}));
  }
  ENCORE_RETURN_IF_ERROR(add("attn_kv_a_norm.weight", DType::kF32, {m.kv_lora_rank}));
  ENCORE_RETURN_IF_ERROR(add("attn_kv_b.weight", DType::kBf16, {m.heads, m.nope_dim + m.v_dim, m.kv_lora_rank}));
  return add("attn_output.weight", DType::kQ4K, {d, std::int64_t(m.heads) * m.v_dim});
}

Status add_dense(const ModelConfig& c, const LayerAdder& add) {
  ENCORE_RETURN_IF_ERROR(add("ffn_gate.weight", DType::kQ4K, {c.dense_width, c.hidden}));
  ENCORE_RETURN_IF_ERROR(add("ffn_up.weight", DType::kQ4K, {c.dense_width, c.hidden}));
  return add("ffn_down.weight", DType::kQ4K, {c.hidden, c.dense_width});
}

// Shared experts as a stack of S matrices after the routed ones. GGUF stores S > 1 shared experts
// as one wider matrix: identical bytes for gate/up, but the loader must split ffn_down_shexp's rows.
Status add_moe(const ModelConfig& c, const LayerAdder& add) {
  const MoeConfig& e = c.moe;
  const std::int64_t d = c.hidden, I = e.expert_width;
  ENCORE_RETURN_IF_ERROR(add("ffn_gate_inp.weight", DType::kBf16, {e.experts, d}));
  if (e.selection_bias) ENCORE_RETURN_IF_ERROR(add("exp_probs_b.bias", DType::kF32, {e.experts}));
  struct Stack {
    const char *routed, *shared;
    Dims matrix;
  };
  for (const Stack& s : {Stack{"ffn_gate_exps.weight", "ffn_gate_shexp.weight", {I, d}},
                         Stack{"ffn_up_exps.weight", "ffn_up_shexp.weight", {I, d}},
                         Stack{"ffn_down_exps.weight", "ffn_down_shexp.weight", {d, I}}}) {
    ENCORE_RETURN_IF_ERROR(add(s.routed, DType::kQ4K, {e.experts, s.matrix[0], s.matrix[1]}));
    if (e.shared_experts > 0)
      ENCORE_RETURN_IF_ERROR(add(s.shared, DType::kQ4K, {e.shared_experts, s.matrix[0], s.matrix[1]}, true));
  }
  return {};
}

}  // namespace

std::string layer_tensor(int layer, const char* base) { return "blk." + std::to_string(layer) + "." + base; }

Status build_weight_layout(const ModelConfig& c, TensorArena& weights) {
  ENCORE_RETURN_IF_ERROR(c.validate());
  weights = TensorArena{};
  ENCORE_RETURN_IF_ERROR(weights.add("token_embd.weight", DType::kBf16, {c.vocab, c.hidden}));
  for (int l = 0; l < c.layers(); ++l) {
    const LayerAdder add{weights, l};
    ENCORE_RETURN_IF_ERROR(add("attn_norm.weight", DType::kF32, {c.hidden}));
    ENCORE_RETURN_IF_ERROR(c.attention[l] == Attention::kKda ? add_kda(c, add) : add_mla(c, add));
    ENCORE_RETURN_IF_ERROR(add("ffn_norm.weight", DType::kF32, {c.hidden}));
    ENCORE_RETURN_IF_ERROR(c.mlp[l] == Mlp::kDense ? add_dense(c, add) : add_moe(c, add));
  }
  ENCORE_RETURN_IF_ERROR(weights.add("output_norm.weight", DType::kF32, {c.hidden}));
  return weights.add("output.weight", DType::kQ4K, {c.vocab, c.hidden});
}

}  // namespace encore::pipeline
