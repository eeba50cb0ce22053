// Weight arena: 256-byte aligned, non-overlapping tensors; fused groups contiguous; per-layer sums
// against layer_bytes() (model_config.cpp, counted independently of the table); the Kimi total
// against a hand sum of docs/model.md §5.
#include <encore/pipeline/weight_layout.h>

#include <string>

#include "test_util.h"

namespace encore::pipeline {
namespace {

TensorArena layout_of(const ModelConfig& c) {
  TensorArena w;
  throw_if_error(build_weight_layout(c, w));
  return w;
}

std::vector<ModelConfig> all_configs() {
  return {ModelConfig::kimi_linear_48b(), ModelConfig::tiny(false), ModelConfig::tiny(true)};
}

std::int64_t bytes_with_prefix(const TensorArena& a, const std::string& prefix) {
  std::int64_t sum = 0;
  for (const TensorInfo& t : a.tensors())
    if (t.name.rfind(prefix, 0) == 0) sum += t.bytes;
  return sum;
}

TEST(TensorArena, AlignsChecksAndFinds) {
  TensorArena a;
  ENCORE_OK(a.add("a", DType::kF32, {25}));  // 100 bytes
  ENCORE_OK(a.add("b", DType::kQ4K, {2, 512}));
  EXPECT_EQ(a.find("b")->offset, 256);
  EXPECT_EQ(a.find("b")->bytes, 2 * 2 * 144);
  EXPECT_EQ(a.total_bytes(), 1024);  // 256 + 576, rounded up to 256
  EXPECT_EQ(a.add("c", DType::kF32, {4}, true).code(), StatusCode::kInvalidArgument);  // b ends at 832: off the 256 grid
  EXPECT_EQ(a.add("a", DType::kF32, {4}).code(), StatusCode::kInvalidArgument);        // duplicate
  EXPECT_EQ(a.add("d", DType::kQ4K, {4, 100}).code(), StatusCode::kInvalidArgument);   // Q4_K inner dim
  EXPECT_EQ(a.find("missing"), nullptr);
  const TensorInfo* t = nullptr;
  EXPECT_EQ(a.lookup("missing", t).code(), StatusCode::kInvalidArgument);
}

TEST(WeightLayout, AlignedAndDisjoint) {
  for (const ModelConfig& c : all_configs()) {
    const TensorArena w = layout_of(c);
    std::int64_t end = 0;
    for (const TensorInfo& t : w.tensors()) {
      EXPECT_EQ(t.offset % 256, 0) << c.name << " " << t.name;
      EXPECT_GE(t.offset, end) << c.name << " " << t.name << " overlaps its predecessor";
      EXPECT_EQ(t.bytes, tensor_bytes(t.dtype, t.dims)) << t.name;
      end = t.offset + t.bytes;
    }
    EXPECT_LE(end, w.total_bytes());
    EXPECT_EQ(w.total_bytes() % 256, 0);
  }
}

// Each fused group must be one contiguous span: one pointer, one GEMV (or one expert stack).
TEST(WeightLayout, FusedGroupsAreContiguous) {
  const std::vector<std::vector<const char*>> kda = {
      {"attn_q.weight", "attn_k.weight", "attn_v.weight", "ssm_f_a.weight", "ssm_g_a.weight", "ssm_beta.weight"},
      {"ssm_conv1d_q.weight", "ssm_conv1d_k.weight", "ssm_conv1d_v.weight"}};
  const std::vector<std::vector<const char*>> moe = {{"ffn_gate_exps.weight", "ffn_gate_shexp.weight"},
                                                     {"ffn_up_exps.weight", "ffn_up_shexp.weight"},
                                                     {"ffn_down_exps.weight", "ffn_down_shexp.weight"}};
  for (const ModelConfig& c : all_configs()) {
    const TensorArena w = layout_of(c);
    auto check = [&](int l, const std::vector<const char*>& group) {
      for (std::size_t i = 1; i < group.size(); ++i) {
        const TensorInfo* prev = w.find(layer_tensor(l, group[i - 1]));
        const TensorInfo* next = w.find(layer_tensor(l, group[i]));
        ASSERT_TRUE(prev && next) << c.name << " layer " << l << " " << group[i];
        EXPECT_EQ(prev->offset + prev->bytes, next->offset) << c.name << " layer " << l << " " << group[i];
      }
    };
    for (int l = 0; l < c.layers(); ++l) {
      if (c.attention[l] == Attention::kKda)
        for (const auto& g : kda) check(l, g);
      else
        check(l, {c.mla.q_lora_rank ? "attn_q_a.weight" : "attn_q.weight", "attn_kv_a_mqa.weight"});
      if (c.mlp[l] == Mlp::kMoe)
        for (const auto& g : moe) check(l, g);
    }
  }
}

TEST(WeightLayout, DtypesFollowTheSpecs) {
  const TensorArena w = layout_of(ModelConfig::kimi_linear_48b());
  const std::pair<std::string, DType> expected[] = {
      {"token_embd.weight", DType::kBf16},         {"output.weight", DType::kQ4K},
      {"output_norm.weight", DType::kF32},         {"blk.0.attn_q.weight", DType::kQ4K},
      {"blk.0.ssm_beta.weight", DType::kQ4K},      {"blk.0.ssm_f_b.weight", DType::kBf16},
      {"blk.0.ssm_g_b.weight", DType::kBf16},      {"blk.0.ssm_conv1d_v.weight", DType::kF32},
      {"blk.0.ssm_a_log", DType::kF32},            {"blk.0.ssm_dt.bias", DType::kF32},
      {"blk.0.ffn_gate.weight", DType::kQ4K},      {"blk.3.attn_kv_b.weight", DType::kBf16},
      {"blk.3.attn_kv_a_mqa.weight", DType::kQ4K}, {"blk.3.attn_kv_a_norm.weight", DType::kF32},
      {"blk.3.ffn_gate_inp.weight", DType::kBf16}, {"blk.3.exp_probs_b.bias", DType::kF32},
      {"blk.3.ffn_down_exps.weight", DType::kQ4K}, {"blk.26.attn_output.weight", DType::kQ4K}};
  for (const auto& [name, dtype] : expected) {
    const TensorInfo* t = w.find(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(t->dtype, dtype) << name << " is " << to_string(t->dtype);
  }
  EXPECT_EQ(w.find("blk.3.ffn_down_exps.weight")->dims, (std::vector<std::int64_t>{256, 2304, 1024}));
  EXPECT_EQ(w.find("blk.3.attn_kv_b.weight")->dims, (std::vector<std::int64_t>{32, 256, 512}));
  EXPECT_EQ(w.find("blk.3.attn_q.weight")->dims, (std::vector<std::int64_t>{6144, 2304}));
  EXPECT_EQ(w.find("blk.1.ffn_gate.weight"), nullptr);  // MoE layer: no dense MLP
  EXPECT_EQ(w.find("blk.3.ssm_a_log"), nullptr);        // MLA layer: no KDA tensors
}

// The table's per-layer sums equal layer_bytes(), which counts the same tensors from the dims.
TEST(WeightLayout, LayerSumsMatchLayerBytes) {
  for (const ModelConfig& c : all_configs()) {
    const TensorArena w = layout_of(c);
    const LayerBytes b = layer_bytes(c);
    const int experts = c.moe.experts + c.moe.shared_experts;
    for (int l = 0; l < c.layers(); ++l) {
      const std::int64_t attention = c.attention[l] == Attention::kKda ? b.kda : b.mla;  // includes both norms
      const std::int64_t mlp = c.mlp[l] == Mlp::kDense ? b.dense_mlp : b.moe_router + experts * b.expert;
      EXPECT_EQ(bytes_with_prefix(w, "blk." + std::to_string(l) + "."), attention + mlp) << c.name << " layer " << l;
    }
    EXPECT_EQ(w.find("output.weight")->bytes, b.lm_head) << c.name;
    EXPECT_EQ(w.find("output_norm.weight")->bytes + w.find("token_embd.weight")->bytes / c.vocab, b.head_other) << c.name;
  }
}

// docs/model.md §5 by hand: embedding 163,840 x 2,304 bf16 = 754,974,720; 20 KDA layers x 23,936,128;
// 7 MLA x 22,426,624; dense 35,831,808; 26 MoE x (1,179,648 + 1,024 + 257 x 3,981,312);
// LM head 212,336,640 + final norm 9,216. Padding: only A_log (32 floats = 128 B) ends off a
// 256-byte boundary, once per KDA layer.
TEST(WeightLayout, KimiTotalMatchesHandCount) {
  const TensorArena w = layout_of(ModelConfig::kimi_linear_48b());
  std::int64_t sum = 0;
  for (const TensorInfo& t : w.tensors()) sum += t.bytes;
  EXPECT_EQ(sum, 28'272'685'568);
  EXPECT_EQ(w.total_bytes(), 28'272'685'568 + 20 * 128);
  EXPECT_EQ(int(w.tensors().size()), 3 + 27 * 2 + 20 * 15 + 7 * 5 + 3 + 26 * 8);
}

}  // namespace
}  // namespace encore::pipeline
