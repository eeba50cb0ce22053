// Model configuration: layer lists, validation, and the byte budget of one decode step against the
// totals published in docs/model.md §5 (an independent hand count).
#include <encore/pipeline/model_config.h>
#include <encore/pipeline/pipeline.h>

#include <cmath>
#include <limits>
#include <memory>

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

TEST(ModelConfig, LayerSpecsGiveFullWidthModelsOfAFewLayers) {
  ModelConfig c = ModelConfig::kimi_linear_48b();
  const ModelConfig full = c;
  ASSERT_TRUE(ModelConfig::layers_from_spec("KdKeMe", c).ok());
  EXPECT_EQ(c.attention, (std::vector<Attention>{Attention::kKda, Attention::kKda, Attention::kMla}));
  EXPECT_EQ(c.mlp, (std::vector<Mlp>{Mlp::kDense, Mlp::kMoe, Mlp::kMoe}));
  EXPECT_EQ(c.hidden, full.hidden);
  EXPECT_TRUE(c.validate().ok()) << c.validate().to_string();
  // The preset's first four layers, spelled out.
  ASSERT_TRUE(ModelConfig::layers_from_spec("KdKeKeMe", c).ok());
  EXPECT_EQ(c.attention, std::vector<Attention>(full.attention.begin(), full.attention.begin() + 4));
  EXPECT_EQ(c.mlp, std::vector<Mlp>(full.mlp.begin(), full.mlp.begin() + 4));
  for (const char* bad : {"", "K", "Kx", "kd", "KdMeX", "Ed"}) {
    ModelConfig unchanged = full;
    const Status s = ModelConfig::layers_from_spec(bad, unchanged);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_EQ(unchanged.attention, full.attention) << bad;  // nothing written on error
  }
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


// Pipeline::create refuses a model its stages cannot run before it allocates anything: the same
// code on a machine with or without a GPU (the stage checks run on the host over stand-in bases).
TEST(PipelineCreate, RefusesBadModelsBeforeAllocating) {
  BufferOptions o;
  o.max_batch = 2, o.max_slots = 4, o.max_pages = 8, o.max_pages_per_seq = 4, o.mla_num_parts = 132;
  auto refused = [&](const char* what, auto edit) {
    ModelConfig c = ModelConfig::tiny();
    edit(c);
    std::unique_ptr<Pipeline> p;
    const Status s = Pipeline::create(c, o, p);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << what << ": " << s.to_string();
    EXPECT_EQ(p, nullptr) << what;
  };
  refused("rms_eps < 0", [](ModelConfig& c) { c.rms_eps = -1.f; });
  refused("rms_eps = inf", [](ModelConfig& c) { c.rms_eps = std::numeric_limits<float>::infinity(); });
  refused("top_k > experts", [](ModelConfig& c) { c.moe.top_k = c.moe.experts + 1; });
}

}  // namespace
}  // namespace encore::pipeline
