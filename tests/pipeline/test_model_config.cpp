// Model configuration: layer lists, validation, and the byte budget of one decode step against the
// totals published in docs/model.md §5 (an independent hand count).
#include <encore/pipeline/model_config.h>

#include <cmath>

#include "test_util.h"

namespace encore::pipeline {
namespace {

TEST(ModelConfig, KimiLayerListIsOneBased) {
  const ModelConfig c = ModelConfig::kimi_linear_48b();
  ASSERT_EQ(c.layers(), 27);
  EXPECT_EQ(c.count(Attention::kKda), 20);
  EXPECT_EQ(c.count(Attention::kMla), 7);
  for (int i : {3, 7, 11, 15, 19, 23, 26}) EXPECT_EQ(c.attention[i], Attention::kMla) << "0-based layer " << i;
  for (int i : {0, 1, 2, 4, 24, 25}) EXPECT_EQ(c.attention[i], Attention::kKda) << "0-based layer " << i;
  EXPECT_EQ(c.mlp[0], Mlp::kDense);
  EXPECT_EQ(c.count(Mlp::kMoe), 26);
  EXPECT_TRUE(c.validate().ok()) << c.validate().to_string();
}

TEST(ModelConfig, TinyVariantsAreValid) {
  for (bool rope : {false, true}) {
    const ModelConfig c = ModelConfig::tiny(rope);
    EXPECT_TRUE(c.validate().ok()) << c.validate().to_string();
    EXPECT_EQ(c.layers(), 5);
    EXPECT_EQ(c.attention[2], Attention::kMla);
    EXPECT_EQ(c.attention[4], Attention::kMla);
    EXPECT_EQ(c.attention[3], Attention::kKda);
    EXPECT_EQ(c.mla.nope, !rope);
  }
}

TEST(ModelConfig, LayerListsAreChecked) {
  ModelConfig c;
  EXPECT_EQ(ModelConfig::layers_from_lists(4, {1, 2}, {3}, 1, c).code(), StatusCode::kInvalidArgument);  // layer 4 missing
  EXPECT_EQ(ModelConfig::layers_from_lists(4, {1, 2, 3}, {3, 4}, 1, c).code(), StatusCode::kInvalidArgument);  // 3 twice
  EXPECT_EQ(ModelConfig::layers_from_lists(4, {0, 1, 2}, {4}, 1, c).code(), StatusCode::kOutOfRange);  // 0-based by mistake
  EXPECT_EQ(ModelConfig::layers_from_lists(4, {1, 2, 3}, {4}, 5, c).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(ModelConfig::layers_from_lists(4, {1, 2, 3}, {4}, 0, c).ok());
}

TEST(ModelConfig, ValidationRejectsWhatTheKernelsCannotRun) {
  auto broken = [](auto&& edit) {
    ModelConfig c = ModelConfig::kimi_linear_48b();
    edit(c);
    return c.validate().code();
  };
  EXPECT_EQ(broken([](ModelConfig& c) { c.hidden = 2300; }), StatusCode::kInvalidArgument);
  EXPECT_EQ(broken([](ModelConfig& c) { c.kda.head_dim = 96; }), StatusCode::kUnsupported);
  EXPECT_EQ(broken([](ModelConfig& c) { c.moe.groups = 3; }), StatusCode::kInvalidArgument);
  EXPECT_EQ(broken([](ModelConfig& c) { c.moe.top_k = 300; }), StatusCode::kInvalidArgument);
  EXPECT_EQ(broken([](ModelConfig& c) { c.moe.expert_width = 1000; }), StatusCode::kInvalidArgument);
  EXPECT_EQ(broken([](ModelConfig& c) { c.mla.kv_lora_rank = 256; }), StatusCode::kUnsupported);
  EXPECT_EQ(broken([](ModelConfig& c) { c.mlp.pop_back(); }), StatusCode::kInvalidArgument);
}

// docs/model.md §5, batch 1: every per-layer figure and the totals at 4K and 32K context.
TEST(ModelConfig, KimiByteBudgetMatchesTheSpec) {
  const ModelConfig c = ModelConfig::kimi_linear_48b();
  const LayerBytes b = layer_bytes(c);
  EXPECT_EQ(b.kda, 23'936'128);
  EXPECT_EQ(b.mla, 22'426'624);
  EXPECT_EQ(b.dense_mlp, 35'831'808);
  EXPECT_EQ(b.moe_router + 9 * b.expert, 37'012'480);
  EXPECT_EQ(b.expert, 3'981'312);
  EXPECT_EQ(b.lm_head, 212'336'640);
  const StepBytes at4k = step_bytes(c, 1, 4096), at32k = step_bytes(c, 1, 32768);
  EXPECT_DOUBLE_EQ(at4k.weights, 1'846'215'680.0);
  EXPECT_DOUBLE_EQ(at4k.kda_state, 83'886'080.0);
  EXPECT_DOUBLE_EQ(at4k.kda_conv, 5'898'240.0);
  EXPECT_DOUBLE_EQ(at4k.mla_cache, 33'030'144.0);
  EXPECT_DOUBLE_EQ(at4k.total(), 1'969'030'144.0);
  EXPECT_DOUBLE_EQ(at32k.total(), 2'200'241'152.0);
}

// docs/model.md §5's batch table (uniform routing, 4K context), quoted to three digits.
TEST(ModelConfig, KimiBatchBudgetMatchesTheSpec) {
  const ModelConfig c = ModelConfig::kimi_linear_48b();
  const std::pair<int, double> table[] = {{1, 1.97e9}, {8, 7.94e9}, {32, 21.85e9}, {64, 31.90e9}};
  for (auto [batch, bytes] : table) EXPECT_NEAR(step_bytes(c, batch, 4096).total(), bytes, 0.01e9) << "batch " << batch;
}

}  // namespace
}  // namespace encore::pipeline
