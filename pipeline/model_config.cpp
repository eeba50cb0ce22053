#include <encore/pipeline/model_config.h>

#include <algorithm>
#include <cmath>

namespace encore::pipeline {
namespace {

constexpr std::int64_t kF32 = 4, kBf16 = 2;

// Q4_K bytes of an N x K matrix: 144 bytes per 256 weights.
std::int64_t q4k(std::int64_t n, std::int64_t k) { return n * (k / 256) * 144; }

}  // namespace

int ModelConfig::count(Attention a) const { return int(std::count(attention.begin(), attention.end(), a)); }
int ModelConfig::count(Mlp m) const { return int(std::count(mlp.begin(), mlp.end(), m)); }

ModelConfig ModelConfig::kimi_linear_48b() {
  ModelConfig c;
  c.name = "Kimi-Linear-48B-A3B";
  // config.json: kda_layers / full_attn_layers are 1-based; first_k_dense_replace = 1.
  std::vector<int> kda, full;
  for (int i = 1; i <= 27; ++i) (i % 4 == 0 || i == 27 ? full : kda).push_back(i);
  throw_if_error(layers_from_lists(27, kda, full, 1, c));
  return c;
}

Status ModelConfig::layers_from_spec(std::string_view spec, ModelConfig& config) {
  ENCORE_REQUIRE(!spec.empty() && spec.size() % 2 == 0, StatusCode::kInvalidArgument, "layers_from_spec: \"", spec,
                 "\" is not a sequence of letter pairs (K or M, then d or e)");
  std::vector<Attention> attention;
  std::vector<Mlp> mlp;
  for (std::size_t i = 0; i < spec.size(); i += 2) {
    const char a = spec[i], m = spec[i + 1];
    ENCORE_REQUIRE((a == 'K' || a == 'M') && (m == 'd' || m == 'e'), StatusCode::kInvalidArgument, "layers_from_spec: layer ",
                   i / 2, " is \"", spec.substr(i, 2), "\" (want K or M, then d or e)");
    attention.push_back(a == 'K' ? Attention::kKda : Attention::kMla);
    mlp.push_back(m == 'd' ? Mlp::kDense : Mlp::kMoe);
  }
  config.attention = std::move(attention), config.mlp = std::move(mlp);
  return {};
}

ModelConfig ModelConfig::with_kda_for_mla() const {
  ModelConfig c = *this;
  c.name = name + "-kda";
  for (Attention& a : c.attention) a = Attention::kKda;
  return c;
}

ModelConfig ModelConfig::tiny(bool rope) {
  ModelConfig c;
  c.name = rope ? "tiny-rope" : "tiny";
  c.hidden = 256;
  c.vocab = 512;
  c.dense_width = 512;
  c.kda.heads = 2;
  c.mla.heads = 8;  // the fewest the MLA op specialises on (mla_validate.cpp; docs/model.md §6)
  c.moe.experts = 16;
  c.moe.top_k = 4;
  c.moe.groups = 4;
  c.moe.kept_groups = 2;
  c.moe.expert_width = 256;
  if (rope) {
    c.mla.nope = false;
    c.mla.q_lora_rank = 256;
    c.mla.softmax_scale = 0.1352338f;  // 192^-0.5 * mscale^2 (YaRN factor 40)
  }
  throw_if_error(layers_from_lists(5, {1, 2, 4}, {3, 5}, 1, c));
  return c;
}

ModelConfig ModelConfig::tiny_kimi_linear() {
  ModelConfig c;
  c.name = "tiny-kimi-linear";
  c.hidden = 256, c.vocab = 512, c.dense_width = 512;
  c.kda.heads = c.mla.heads = 8;
  c.moe.experts = 16, c.moe.top_k = 4, c.moe.expert_width = 256;
  throw_if_error(layers_from_lists(4, {1, 2, 4}, {3}, 1, c));
  return c;
}

Status ModelConfig::layers_from_lists(int layers, const std::vector<int>& kda_layers_1based,
                                      const std::vector<int>& full_attn_layers_1based, int first_dense_layers,
                                      ModelConfig& config) {
  ENCORE_REQUIRE(layers >= 1, StatusCode::kInvalidArgument, "model: layers must be >= 1 (got ", layers, ")");
  ENCORE_REQUIRE(first_dense_layers >= 0 && first_dense_layers <= layers, StatusCode::kInvalidArgument,
                 "model: first_k_dense_replace out of range (got ", first_dense_layers, ")");
  std::vector<int> seen(layers, 0);
  std::vector<Attention> attention(layers, Attention::kKda);
  auto mark = [&](const std::vector<int>& list, Attention kind) -> Status {
    for (int one_based : list) {
      ENCORE_REQUIRE(one_based >= 1 && one_based <= layers, StatusCode::kOutOfRange, "model: layer ", one_based,
                     " is outside 1..", layers, " (the lists are 1-based)");
      ++seen[one_based - 1];
      attention[one_based - 1] = kind;
    }
    return {};
  };
  ENCORE_RETURN_IF_ERROR(mark(kda_layers_1based, Attention::kKda));
  ENCORE_RETURN_IF_ERROR(mark(full_attn_layers_1based, Attention::kMla));
  for (int i = 0; i < layers; ++i)
    ENCORE_REQUIRE(seen[i] == 1, StatusCode::kInvalidArgument, "model: 1-based layer ", i + 1, " appears ", seen[i],
                   " times in kda_layers + full_attn_layers (must be exactly once)");
  config.attention = attention;
  config.mlp.assign(layers, Mlp::kMoe);
  std::fill(config.mlp.begin(), config.mlp.begin() + first_dense_layers, Mlp::kDense);
  return {};
}

Status ModelConfig::validate() const {
  ENCORE_REQUIRE(!attention.empty() && attention.size() == mlp.size(), StatusCode::kInvalidArgument,
                 "model: per-layer attention and MLP lists must be non-empty and of equal length");
  auto multiple_of_256 = [](const char* what, std::int64_t dim) -> Status {
    ENCORE_REQUIRE(dim > 0 && dim % 256 == 0, StatusCode::kInvalidArgument, "model: ", what, " = ", dim,
                   " is the input dim of a Q4_K projection and must be a positive multiple of 256");
    return {};
  };
  ENCORE_RETURN_IF_ERROR(multiple_of_256("hidden", hidden));
  if (count(Attention::kKda) > 0) {
    ENCORE_REQUIRE(kda.head_dim == 64 || kda.head_dim == 128, StatusCode::kUnsupported, "model: KDA head_dim must be 64 or 128");
    ENCORE_RETURN_IF_ERROR(multiple_of_256("KDA heads * head_dim (o_proj input)", std::int64_t(kda.heads) * kda.head_dim));
    ENCORE_REQUIRE(kda.conv_kernel == 4, StatusCode::kUnsupported, "model: KDA conv kernel must be 4");
  }
  if (count(Attention::kMla) > 0) {
    ENCORE_REQUIRE(mla.kv_lora_rank == 512 && mla.rope_dim == 64, StatusCode::kUnsupported,
                   "model: MLA needs kv_lora_rank 512 and rope dim 64 (576-wide cache rows)");
    ENCORE_RETURN_IF_ERROR(multiple_of_256("MLA heads * v_dim (o_proj input)", std::int64_t(mla.heads) * mla.v_dim));
    if (mla.q_lora_rank > 0) ENCORE_RETURN_IF_ERROR(multiple_of_256("MLA q_lora_rank (q_b input)", mla.q_lora_rank));
    ENCORE_REQUIRE(mla.softmax_scale > 0.f, StatusCode::kInvalidArgument, "model: MLA softmax scale must be positive");
  }
  if (count(Mlp::kDense) > 0) ENCORE_RETURN_IF_ERROR(multiple_of_256("dense width (down input)", dense_width));
  if (count(Mlp::kMoe) > 0) {
    ENCORE_RETURN_IF_ERROR(multiple_of_256("expert width (down input)", moe.expert_width));
    ENCORE_REQUIRE(moe.groups >= 1 && moe.experts % moe.groups == 0, StatusCode::kInvalidArgument,
                   "model: groups must divide experts (", moe.experts, " / ", moe.groups, ")");
    ENCORE_REQUIRE(moe.kept_groups >= 1 && moe.kept_groups <= moe.groups, StatusCode::kInvalidArgument,
                   "model: kept groups must be in 1..groups");
    ENCORE_REQUIRE(moe.top_k >= 1 && moe.top_k <= moe.kept_groups * (moe.experts / moe.groups), StatusCode::kInvalidArgument,
                   "model: top_k must be in 1..kept_groups * experts / groups");
  }
  ENCORE_REQUIRE(vocab >= 1, StatusCode::kInvalidArgument, "model: vocab must be >= 1");
  return {};
}

LayerBytes layer_bytes(const ModelConfig& c) {
  LayerBytes b;
  const std::int64_t d = c.hidden, norms = 2 * d * kF32;  // input + post-attention RMSNorm
  const KdaConfig& k = c.kda;
  const std::int64_t p = std::int64_t(k.heads) * k.head_dim;
  b.kda = 3 * q4k(p, d) + q4k(d, p) + 2 * q4k(k.gate_rank, d) + q4k(k.heads, d)  // q k v, o, f_a g_a, b
          + 2 * p * k.gate_rank * kBf16                                           // f_b, g_b
          + 3 * p * k.conv_kernel * kF32 + k.heads * kF32 + p * kF32 + k.head_dim * kF32 + norms;
  const MlaConfig& m = c.mla;
  const std::int64_t q_width = std::int64_t(m.heads) * (m.nope_dim + m.rope_dim);
  const std::int64_t q_path = m.q_lora_rank == 0 ? q4k(q_width, d)
                                                 : q4k(m.q_lora_rank, d) + m.q_lora_rank * kF32 + q4k(q_width, m.q_lora_rank);
  b.mla = q_path + q4k(m.kv_lora_rank + m.rope_dim, d) + q4k(d, std::int64_t(m.heads) * m.v_dim)
          + std::int64_t(m.heads) * (m.nope_dim + m.v_dim) * m.kv_lora_rank * kBf16  // W_UK, W_UV
          + m.kv_lora_rank * kF32 + norms;
  b.dense_mlp = 3 * q4k(c.dense_width, d);
  b.moe_router = std::int64_t(c.moe.experts) * d * kBf16 + (c.moe.selection_bias ? c.moe.experts * kF32 : 0);
  b.expert = 3 * q4k(c.moe.expert_width, d);
  b.lm_head = q4k(c.vocab, d);
  b.head_other = d * kF32 + d * kBf16;  // final norm + one embedding row
  return b;
}

StepBytes step_bytes(const ModelConfig& c, int batch, std::int64_t context) {
  const LayerBytes b = layer_bytes(c);
  const double touched = c.moe.experts * (1.0 - std::pow(1.0 - double(c.moe.top_k) / c.moe.experts, batch));
  const int kda_layers = c.count(Attention::kKda), mla_layers = c.count(Attention::kMla);
  StepBytes s;
  s.weights = double(kda_layers) * b.kda + double(mla_layers) * b.mla + c.count(Mlp::kDense) * double(b.dense_mlp) +
              c.count(Mlp::kMoe) * (b.moe_router + (touched + c.moe.shared_experts) * b.expert) + b.lm_head +
              c.hidden * double(kF32) + double(batch) * c.hidden * kBf16;
  const double p = double(c.kda.heads) * c.kda.head_dim;
  s.kda_state = double(batch) * kda_layers * 2.0 * p * c.kda.head_dim * kF32;
  s.kda_conv = double(batch) * kda_layers * 2.0 * (c.kda.conv_kernel - 1) * 3 * p * kF32;
  s.mla_cache = double(batch) * mla_layers * double(context) * (c.mla.kv_lora_rank + c.mla.rope_dim) * kBf16;
  return s;
}

}  // namespace encore::pipeline
