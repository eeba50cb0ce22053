// CPU tests of the MoE ops: the fp64 routing reference on hand-built cases, and argument
// validation that fails before anything is launched (runs without a GPU).
#include <cmath>
#include <cstring>
#include <algorithm>
#include <random>
#include <set>
#include <vector>

#include <gtest/gtest.h>

#include <encore/ops/moe.h>
#include <encore/ref/moe.h>

#include "moe_test_data.h"

namespace encore {
namespace {

using ops::MoeRoutingConfig;

float logit_of(double s) { return float(std::log(s / (1.0 - s))); }

// DeepSeek-V3 grouping case: groups 0..4 each hold one expert at 0.99, groups 5..7 two at 0.6,
// everything else 0.01. Group scores (top-2 sums): 1.0 for 0..4 (exact tie), 1.2 for 5..7, so
// the kept groups are {5, 6, 7, 0}; ungrouped top-8 would take all five 0.99s instead.
std::vector<float> grouping_case_logits() {
  std::vector<float> u(256, logit_of(0.01));
  for (int g = 0; g < 5; ++g) u[g * 32 + 5] = logit_of(0.99);
  for (int g = 5; g < 8; ++g) u[g * 32 + 1] = u[g * 32 + 2] = logit_of(0.6);
  return u;
}

TEST(MoeRouterRef, GroupedSelectionDiffersFromUngrouped) {
  const auto u = grouping_case_logits();
  const std::vector<float> zero_bias(256, 0.f);
  MoeRoutingConfig grouped = MoeRoutingConfig::deepseek_v3();
  std::vector<int> ids(8);
  std::vector<double> w(8);
  ref::moe_topk(grouped, u.data(), zero_bias.data(), 1, ids.data(), w.data());
  EXPECT_EQ(ids, (std::vector<int>{5, 161, 162, 193, 194, 225, 226, 0}));
  MoeRoutingConfig ungrouped = grouped;
  ungrouped.n_group = ungrouped.topk_group = 1;
  std::vector<int> flat(8);
  ref::moe_topk(ungrouped, u.data(), zero_bias.data(), 1, flat.data(), w.data());
  EXPECT_EQ(flat, (std::vector<int>{5, 37, 69, 101, 133, 161, 162, 193}));
  // Weights: unbiased scores, renormalised, x2.5.
  double sum = 0.99 + 6 * 0.6 + 0.01;
  ref::moe_topk(grouped, u.data(), zero_bias.data(), 1, ids.data(), w.data());
  EXPECT_NEAR(w[0], 2.5 * 0.99 / sum, 1e-6);  // scores are fp32 logits' sigmoids: ~1e-7 off
  EXPECT_NEAR(w[7], 2.5 * 0.01 / sum, 1e-6);
}

TEST(MoeRouterRef, ExactTiesGoToTheLowerIndex) {
  const std::vector<float> u(256, 0.25f);
  MoeRoutingConfig kimi = MoeRoutingConfig::kimi_linear();
  std::vector<int> ids(8);
  std::vector<double> w(8);
  ref::moe_topk(kimi, u.data(), nullptr, 1, ids.data(), w.data());
  EXPECT_EQ(ids, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  for (double v : w) EXPECT_NEAR(v, double(kimi.routed_scale) / 8, 1e-12);
}

TEST(MoeRouterRef, BiasSelectsButWeightsStayUnbiased) {
  std::vector<float> u(256);
  for (int e = 0; e < 256; ++e) u[e] = 0.01f * float(e % 17) - 0.05f;
  std::vector<float> bias(256, 0.f);
  bias[200] = 10.f;
  MoeRoutingConfig kimi = MoeRoutingConfig::kimi_linear();
  std::vector<int> ids(8);
  std::vector<double> w(8), w_hf(8);
  ref::moe_topk(kimi, u.data(), bias.data(), 1, ids.data(), w.data());
  EXPECT_EQ(ids[0], 200);
  double sum = 0;
  for (int j = 0; j < 8; ++j) sum += 1.0 / (1.0 + std::exp(-double(u[ids[j]])));
  EXPECT_NEAR(w[0], double(kimi.routed_scale) / (1.0 + std::exp(-double(u[200]))) / sum, 1e-12);
  kimi.hf_remote_biased_weights = true;  // Kimi HF remote code: weights from biased scores
  ref::moe_topk(kimi, u.data(), bias.data(), 1, ids.data(), w_hf.data());
  EXPECT_GT(w_hf[0], w[0] + 1.0);  // (s + 10) / (sum of biased scores) vs s / (sum of scores)
}

TEST(MoeRouterRef, SoftmaxRenormalisedEqualsSoftmaxOverSelected) {
  std::vector<float> u(128);
  for (int e = 0; e < 128; ++e) u[e] = std::sin(0.37f * e) * 3.f;
  std::vector<int> ids(8);
  std::vector<double> w(8);
  ref::moe_topk(MoeRoutingConfig::qwen3_moe(), u.data(), nullptr, 1, ids.data(), w.data());
  double mx = -1e30, sum = 0;
  for (int j = 0; j < 8; ++j) mx = std::max(mx, double(u[ids[j]]));
  for (int j = 0; j < 8; ++j) sum += std::exp(u[ids[j]] - mx);
  for (int j = 0; j < 8; ++j) EXPECT_NEAR(w[j], std::exp(u[ids[j]] - mx) / sum, 1e-12);
  for (int e = 0; e < 128; ++e)  // every unselected logit is below every selected one
    if (std::find(ids.begin(), ids.end(), e) == ids.end())
      for (int j = 0; j < 8; ++j) EXPECT_LT(u[e], u[ids[j]]);
}

TEST(MoeRouterRef, CompatFlagsAndPadRows) {
  // Kimi at k = 1: no renormalisation (weight = scale * sigmoid), DeepSeek at k = 1 renormalises.
  std::vector<float> u(256, -1.f);
  u[17] = 2.f;
  std::vector<int> ids(1);
  std::vector<double> w(1);
  MoeRoutingConfig kimi = MoeRoutingConfig::kimi_linear();
  kimi.top_k = 1;
  ref::moe_topk(kimi, u.data(), nullptr, 1, ids.data(), w.data());
  EXPECT_EQ(ids[0], 17);
  EXPECT_NEAR(w[0], double(kimi.routed_scale) / (1.0 + std::exp(-2.0)), 1e-12);
  MoeRoutingConfig ds = MoeRoutingConfig::deepseek_v3();
  ds.n_group = ds.topk_group = 1, ds.top_k = 1;
  ref::moe_topk(ds, u.data(), nullptr, 1, ids.data(), w.data());
  EXPECT_NEAR(w[0], 2.5, 1e-12);
  // weights_to_bf16: every weight is a bf16 value.
  MoeRoutingConfig qwen = MoeRoutingConfig::qwen3_moe();
  qwen.weights_to_bf16 = true;
  std::vector<float> q(128);
  for (int e = 0; e < 128; ++e) q[e] = std::cos(0.71f * e) * 2.f;
  std::vector<int> qid(8);
  std::vector<double> qw(8);
  ref::moe_topk(qwen, q.data(), nullptr, 1, qid.data(), qw.data());
  for (double v : qw) {
    const float f = float(v);
    std::uint32_t bits;
    std::memcpy(&bits, &f, 4);
    EXPECT_EQ(bits & 0xFFFFu, 0u) << v;
  }
  // mask_fill_zero: with all-negative biased scores the 0-masked dropped groups are selected.
  const std::vector<float> g = grouping_case_logits(), neg(256, -5.f);
  std::vector<int> masked(8), zeroed(8);
  std::vector<double> w8(8);
  ref::moe_topk(MoeRoutingConfig::deepseek_v3(), g.data(), neg.data(), 1, masked.data(), w8.data());
  MoeRoutingConfig fill = MoeRoutingConfig::deepseek_v3();
  fill.mask_fill_zero = true;
  ref::moe_topk(fill, g.data(), neg.data(), 1, zeroed.data(), w8.data());
  for (int id : masked) EXPECT_TRUE(id < 32 || id >= 160) << id;
  EXPECT_EQ(zeroed, (std::vector<int>{32, 33, 34, 35, 36, 37, 38, 39}));
  // Pad rows: ids -1, weights 0.
  const std::vector<int> slots = {0, -1};
  std::vector<float> two(512);
  std::copy(g.begin(), g.end(), two.begin());
  std::copy(g.begin(), g.end(), two.begin() + 256);
  std::vector<int> pid(16);
  std::vector<double> pw(16);
  ref::moe_topk(MoeRoutingConfig::deepseek_v3(), two.data(), nullptr, 2, pid.data(), pw.data(), slots.data());
  for (int j = 8; j < 16; ++j) EXPECT_TRUE(pid[j] == -1 && pw[j] == 0.0);
  EXPECT_EQ(pid[0], 5);
}

// The int8 mode's `ambiguity`: non-negative, zero for codes far from a rounding midpoint, and
// actually raised where a silu(g)*u code sits on one (over 64 one-token draws of a width-256
// expert, ~0.5 such codes per draw are expected; each moves an output by at most one code step).
TEST(MoeExpertsRef, AmbiguityMarksMidpointCodesOnly) {
  std::mt19937_64 rng(20261202);
  const int hidden = 256, inter = 256;
  const auto gate = test::random_q4k_blocks(std::size_t(inter) * hidden / 256, rng);
  const auto up = test::random_q4k_blocks(gate.size(), rng), down = test::random_q4k_blocks(std::size_t(hidden) * inter / 256, rng);
  std::normal_distribution<float> normal;
  int draws_with_slack = 0;
  for (int draw = 0; draw < 64; ++draw) {
    std::vector<float> h(hidden);
    for (float& v : h) v = normal(rng);
    const std::vector<int> ids = {0};
    const std::vector<float> w = {0.75f};
    std::vector<double> out(hidden), slack(hidden, -1.0);
    ref::moe_experts(gate.data(), up.data(), down.data(), 1, 0, 1, hidden, inter, 1, h.data(), ids.data(), w.data(), true,
                     out.data(), nullptr, slack.data());
    double out_norm = 0, slack_max = 0;
    for (int r = 0; r < hidden; ++r) {
      ASSERT_GE(slack[r], 0.0);
      out_norm = std::max(out_norm, std::fabs(out[r]));
      slack_max = std::max(slack_max, slack[r]);
    }
    if (slack_max > 0) ++draws_with_slack;
    EXPECT_LT(slack_max, 0.05 * out_norm) << "draw " << draw;  // a few code steps, not the output's size
  }
  EXPECT_GT(draws_with_slack, 0);
  EXPECT_LT(draws_with_slack, 64);
}

// ---- validation: nothing reaches the GPU ----------------------------------------------------

template <class T>
T* fake(int slot) {  // distinct, 16-byte aligned, far-apart addresses that are never dereferenced
  return reinterpret_cast<T*>(std::uintptr_t(slot + 1) << 40);
}

ops::MoeRouterParams good_router() {
  ops::MoeRouterParams p;
  p.config = MoeRoutingConfig::deepseek_v3();
  p.weight = fake<void>(0);
  p.bias = fake<float>(1);
  p.h = fake<float>(2);
  p.hidden = 2304;
  p.batch = 4;
  p.topk_ids = fake<int>(3);
  p.topk_weights = fake<float>(4);
  p.workspace = fake<void>(5);
  p.workspace_bytes = ops::moe_router_workspace_bytes(4, 256, 2304);
  return p;
}

ops::MoeTopkParams good_topk() {
  ops::MoeTopkParams t;
  t.config = MoeRoutingConfig::qwen3_moe();
  t.logits = fake<float>(0);
  t.topk_ids = fake<int>(1);
  t.topk_weights = fake<float>(2);
  t.batch = 4;
  return t;
}

ops::MoeExpertsParams good_experts() {
  ops::MoeExpertsParams p;
  p.gate = fake<q4k::Block>(0);
  p.up = fake<q4k::Block>(1);
  p.down = fake<q4k::Block>(2);
  p.num_experts = 256;
  p.num_shared = 1;
  p.top_k = 8;
  p.hidden = 2304;
  p.inter = 1024;
  p.batch = 8;
  p.max_batch = 64;
  p.h = fake<float>(3);
  p.x = fake<float>(4);
  p.topk_ids = fake<int>(5);
  p.topk_weights = fake<float>(6);
  p.workspace = fake<void>(7);
  p.workspace_bytes = ops::moe_experts_workspace_bytes(64, 256, 1, 8, 2304, 1024);
  return p;
}

TEST(MoeValidation, RoutingConfigs) {
  EXPECT_TRUE(ops::validate_routing_config(MoeRoutingConfig::deepseek_v3()).ok());
  EXPECT_TRUE(ops::validate_routing_config(MoeRoutingConfig::kimi_linear()).ok());
  EXPECT_TRUE(ops::validate_routing_config(MoeRoutingConfig::qwen3_moe()).ok());
  MoeRoutingConfig c = MoeRoutingConfig::kimi_linear();
  c.num_experts = 8, c.top_k = 9;
  EXPECT_EQ(ops::validate_routing_config(c).code(), StatusCode::kInvalidArgument) << "k > E";
  c = MoeRoutingConfig::deepseek_v3();
  c.n_group = 7;
  EXPECT_EQ(ops::validate_routing_config(c).code(), StatusCode::kInvalidArgument) << "groups not dividing E";
  c = MoeRoutingConfig::deepseek_v3();
  c.topk_group = 9;
  EXPECT_EQ(ops::validate_routing_config(c).code(), StatusCode::kInvalidArgument) << "topk_group > n_group";
  c = MoeRoutingConfig::deepseek_v3();
  c.num_experts = 16, c.topk_group = 1, c.top_k = 4;  // 1 kept group of 2 experts
  EXPECT_EQ(ops::validate_routing_config(c).code(), StatusCode::kInvalidArgument) << "k > kept experts";
  c = MoeRoutingConfig::kimi_linear();
  c.num_experts = 1024;
  EXPECT_EQ(ops::validate_routing_config(c).code(), StatusCode::kInvalidArgument);
}

TEST(MoeValidation, RouterRejectsBadInput) {
  EXPECT_EQ(ops::moe_router([] { auto p = good_router(); p.config.top_k = 300; return p; }(), nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ops::moe_router([] { auto p = good_router(); p.batch = 65; return p; }(), nullptr).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(ops::moe_router([] { auto p = good_router(); p.hidden = 2300; return p; }(), nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ops::moe_router([] { auto p = good_router(); p.weight = nullptr; return p; }(), nullptr).code(), StatusCode::kNullPointer);
  EXPECT_EQ(ops::moe_router([] { auto p = good_router(); p.topk_ids = nullptr; return p; }(), nullptr).code(), StatusCode::kNullPointer);
  EXPECT_EQ(ops::moe_router([] { auto p = good_router(); p.h = reinterpret_cast<const float*>(reinterpret_cast<std::uintptr_t>(p.h) + 4); return p; }(), nullptr).code(),
            StatusCode::kMisaligned);
  EXPECT_EQ(ops::moe_router([] { auto p = good_router(); p.workspace_bytes -= 4; return p; }(), nullptr).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(ops::moe_router([] { auto p = good_router(); p.topk_weights = reinterpret_cast<float*>(p.topk_ids) + 4; return p; }(), nullptr).code(),
            StatusCode::kOverlap);
  EXPECT_EQ(ops::moe_router([] { auto p = good_router(); p.config.topk_group = 9; return p; }(), nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ops::moe_router([] { auto p = good_router(); p.config.n_group = 6; return p; }(), nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ops::moe_router([] { auto p = good_router(); p.slot_ids = reinterpret_cast<const int*>(std::uintptr_t(7) << 40 | 2); return p; }(), nullptr).code(),
            StatusCode::kMisaligned);
  ops::MoeTopkParams t = good_topk();
  t.topk_weights = nullptr;
  EXPECT_EQ(ops::moe_topk(t, nullptr).code(), StatusCode::kNullPointer);
  t.topk_weights = fake<float>(2);
  t.batch = 65;
  EXPECT_EQ(ops::moe_topk(t, nullptr).code(), StatusCode::kOutOfRange);
  t.batch = 4;
  t.config.top_k = 200;
  EXPECT_EQ(ops::moe_topk(t, nullptr).code(), StatusCode::kInvalidArgument);
  t.config = MoeRoutingConfig::qwen3_moe();
  t.logits = reinterpret_cast<const float*>(reinterpret_cast<std::uintptr_t>(t.logits) + 2);
  EXPECT_EQ(ops::moe_topk(t, nullptr).code(), StatusCode::kMisaligned);
  // The fused RMSNorm's weight and epsilon.
  auto normed = [](auto mutate) {
    auto p = good_router();
    p.norm_weight = fake<float>(8);
    mutate(p);
    return ops::moe_router_validate(p).code();
  };
  EXPECT_EQ(normed([](auto&) {}), StatusCode::kOk);
  EXPECT_EQ(normed([](auto& p) { p.norm_weight = reinterpret_cast<const float*>(reinterpret_cast<std::uintptr_t>(p.norm_weight) + 4); }),
            StatusCode::kMisaligned);
  EXPECT_EQ(normed([](auto& p) { p.norm_eps = std::nanf(""); }), StatusCode::kInvalidArgument);
  EXPECT_EQ(normed([](auto& p) { p.norm_eps = -1e-6f; }), StatusCode::kInvalidArgument);
  EXPECT_EQ(normed([](auto& p) { p.norm_weight = reinterpret_cast<const float*>(p.topk_weights); }), StatusCode::kOverlap);
  // The one-kernel router's arrival counter: aligned, and apart from every output.
  auto counted = [](auto mutate) {
    auto p = good_router();
    p.counter = fake<std::int32_t>(9);
    mutate(p);
    return ops::moe_router_validate(p).code();
  };
  EXPECT_EQ(counted([](auto&) {}), StatusCode::kOk);
  EXPECT_EQ(counted([](auto& p) { p.counter = reinterpret_cast<std::int32_t*>(reinterpret_cast<std::uintptr_t>(p.counter) + 2); }),
            StatusCode::kMisaligned);
  EXPECT_EQ(counted([](auto& p) { p.counter = p.topk_ids + 1; }), StatusCode::kOverlap);
  EXPECT_EQ(counted([](auto& p) { p.counter = static_cast<std::int32_t*>(p.workspace); }), StatusCode::kOverlap);
}

TEST(MoeValidation, ExpertsRejectBadInput) {
  auto check = [](auto mutate, StatusCode want) {
    ops::MoeExpertsParams p = good_experts();
    mutate(p);
    EXPECT_EQ(ops::moe_experts(p, nullptr).code(), want);
    EXPECT_EQ(ops::moe_experts_validate(p).code(), want);  // the same checks, without launching
  };
  check([](auto& p) { p.top_k = 300; }, StatusCode::kInvalidArgument);
  check([](auto& p) { p.num_experts = 4, p.top_k = 8; }, StatusCode::kInvalidArgument);  // k > E
  check([](auto& p) { p.batch = 65; }, StatusCode::kOutOfRange);                           // over the captured maximum
  check([](auto& p) { p.max_batch = 16, p.batch = 17; }, StatusCode::kOutOfRange);
  check([](auto& p) { p.max_batch = 65; }, StatusCode::kOutOfRange);
  check([](auto& p) { p.inter = 4096; }, StatusCode::kInvalidArgument);
  check([](auto& p) { p.hidden = 1000; }, StatusCode::kInvalidArgument);
  check([](auto& p) { p.num_shared = 5; }, StatusCode::kInvalidArgument);
  check([](auto& p) { p.down = nullptr; }, StatusCode::kNullPointer);
  check([](auto& p) { p.topk_ids = nullptr; }, StatusCode::kNullPointer);
  check([](auto& p) { p.gate = reinterpret_cast<const q4k::Block*>(reinterpret_cast<std::uintptr_t>(p.gate) + 8); }, StatusCode::kMisaligned);
  check([](auto& p) { p.workspace_bytes = 100; }, StatusCode::kOutOfRange);
  check([](auto& p) { p.x = const_cast<float*>(p.h) + 16; }, StatusCode::kOverlap);
  check([](auto& p) { p.workspace = const_cast<int*>(p.topk_ids); }, StatusCode::kOverlap);
  check([](auto& p) { p.h = nullptr; }, StatusCode::kNullPointer);
  check([](auto& p) { p.slot_ids = reinterpret_cast<const int*>(std::uintptr_t(9) << 40 | 2); }, StatusCode::kMisaligned);
  check([](auto& p) { p.slot_ids = reinterpret_cast<const int*>(p.x); }, StatusCode::kOverlap);
  // Fused RMSNorm: h may be x itself, not a shifted view of it; the norm weight is checked.
  ops::MoeExpertsParams in_place = good_experts();
  in_place.norm_weight = fake<float>(8), in_place.h = in_place.x;
  EXPECT_TRUE(ops::moe_experts_validate(in_place).ok()) << ops::moe_experts_validate(in_place).to_string();
  check([](auto& p) { p.norm_weight = fake<float>(8), p.h = p.x + 64; }, StatusCode::kOverlap);
  check([](auto& p) { p.norm_weight = reinterpret_cast<const float*>(reinterpret_cast<std::uintptr_t>(fake<float>(8)) + 8); },
        StatusCode::kMisaligned);
  check([](auto& p) { p.norm_weight = fake<float>(8), p.norm_eps = INFINITY; }, StatusCode::kInvalidArgument);
  check([](auto& p) { p.norm_weight = reinterpret_cast<const float*>(p.x); }, StatusCode::kOverlap);
  // A shape within the bounds whose streams do not fit the device's shared memory (H200 facts
  // without a GPU): rejected by validation, so a pipeline reports it before any stage runs.
  check([](auto& p) {
    p.hidden = 65536, p.inter = 2048;
    p.workspace_bytes = ops::moe_experts_workspace_bytes(64, 256, 1, 8, 65536, 2048);
  }, StatusCode::kUnsupported);
}

// Valid arguments pass the host-only validators (no device needed); the launchers then fail only on
// the missing device or stream.
TEST(MoeValidation, ValidatorsAcceptGoodArguments) {
  EXPECT_TRUE(ops::moe_router_validate(good_router()).ok()) << ops::moe_router_validate(good_router()).to_string();
  EXPECT_TRUE(ops::moe_experts_validate(good_experts()).ok()) << ops::moe_experts_validate(good_experts()).to_string();
  ops::MoeTopkParams t = good_topk();
  EXPECT_TRUE(ops::moe_topk_validate(t).ok()) << ops::moe_topk_validate(t).to_string();
  t.config.top_k = 200;
  EXPECT_EQ(ops::moe_topk_validate(t).code(), StatusCode::kInvalidArgument);
  auto r = good_router();
  r.workspace_bytes -= 4;
  EXPECT_EQ(ops::moe_router_validate(r).code(), StatusCode::kOutOfRange);
}

// Which plan moe_experts runs, on an H200's limits (no device needed): the work list built inside
// the stream blocks (no prepare kernel) only where every gate/up block gets at most one item; the
// GPU tests' small model takes that path up to 8 tokens, Kimi's shape at B = 1 only.
TEST(MoeExpertsPlan, InBlockListOnlyWhereEveryGateUpBlockGetsOneItem) {
  constexpr int kSms = 132;
  constexpr std::size_t kSmem = 232448;  // 227 KB opt-in per block
  auto plan = [&](int E, int S, int k, int hidden, int inter, int batch) {
    ops::MoeExpertsParams p;
    p.num_experts = E, p.num_shared = S, p.top_k = k, p.hidden = hidden, p.inter = inter, p.batch = batch, p.max_batch = 64;
    ops::MoeExpertsPlan out;
    const Status st = ops::moe_experts_plan(p, &out, kSms, kSmem);
    EXPECT_TRUE(st.ok()) << st.to_string();
    return out;
  };
  // Kimi-Linear (256 + 1 experts, top-8, 2304 x 1024): at B = 1, 9 passes x 32 row groups = 288
  // gate/up items and 36 shared row chunks + 2304 / 8 row sets = 324 down items, one per block at
  // 3 blocks per SM (the down ring one slot deep: a block has one slot of work); from B = 2 the
  // passes no longer fit one item per block.
  const ops::MoeExpertsPlan kimi = plan(256, 1, 8, 2304, 1024, 1);
  EXPECT_TRUE(kimi.in_block_list);
  EXPECT_EQ(kimi.blocks_per_sm, 3);
  EXPECT_EQ(kimi.tokens_per_pass, 1);
  EXPECT_EQ(kimi.gate_up_grid, 288);
  EXPECT_EQ(kimi.down_grid, 324);
  EXPECT_EQ(kimi.gate_up_slots, 2);
  EXPECT_EQ(kimi.down_slots, 1);
  EXPECT_TRUE(kimi.down_row_sets);
  for (const int batch : {2, 4, 8, 32, 64}) {
    SCOPED_TRACE(batch);
    const ops::MoeExpertsPlan general = plan(256, 1, 8, 2304, 1024, batch);
    EXPECT_FALSE(general.in_block_list);
    EXPECT_FALSE(general.down_row_sets);
    EXPECT_EQ(general.blocks_per_sm, 2);
    EXPECT_EQ(general.gate_up_grid, 2 * kSms);
  }
  // GGML's shape (128 experts, top-8, 2048 x 768): its 3-per-SM rings do not fit.
  EXPECT_FALSE(plan(128, 0, 8, 2048, 768, 1).in_block_list);
  // The GPU tests' small model (8 + 1 experts, top-2, 512 x 256).
  for (const int batch : {1, 4, 8}) EXPECT_TRUE(plan(8, 1, 2, 512, 256, batch).in_block_list) << batch;
  EXPECT_EQ(plan(8, 1, 2, 512, 256, 1).down_row_sets, true);  // one token only
  EXPECT_EQ(plan(8, 1, 2, 512, 256, 2).down_row_sets, false);
  EXPECT_FALSE(plan(8, 1, 2, 512, 256, 9).in_block_list);  // more tokens than one pass holds

  // Without limits: the current device (an H200's facts where there is none).
  ops::MoeExpertsParams p;
  p.num_experts = 256, p.num_shared = 1, p.top_k = 8, p.hidden = 2304, p.inter = 1024, p.batch = 1, p.max_batch = 64;
  ops::MoeExpertsPlan here;
  ASSERT_TRUE(ops::moe_experts_plan(p, &here).ok());
  EXPECT_GT(here.gate_up_grid, 0);
  // Bad arguments: a null output, one limit without the other, dims outside the op's bounds.
  EXPECT_EQ(ops::moe_experts_plan(p, nullptr, kSms, kSmem).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ops::moe_experts_plan(p, &here, kSms, 0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ops::moe_experts_plan(p, &here, -1, kSmem).code(), StatusCode::kInvalidArgument);
  p.batch = 65;
  EXPECT_EQ(ops::moe_experts_plan(p, &here, kSms, kSmem).code(), StatusCode::kOutOfRange);
}


TEST(MoeValidation, RouterNormEpsMustBePositive) {
  auto p = good_router();
  p.norm_weight = reinterpret_cast<const float*>((std::uintptr_t(40) + 1) << 32);
  p.norm_eps = 0.f;
  const Status s = ops::moe_router_validate(p);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  EXPECT_NE(s.message().find("moe_router: norm_eps"), std::string::npos) << s.message();
  p.norm_eps = 1e-5f;
  EXPECT_TRUE(ops::moe_router_validate(p).ok()) << ops::moe_router_validate(p).to_string();
}

}  // namespace
}  // namespace encore
