// GPU tests of the KDA decode op against the fp64 reference (docs/kda.md §8). Error metric: relative L2
// (= RMS(diff) / RMS(ref)) over every element. Bounds (docs/kda.md §5): y and recurrent state <= 1e-5 after
// one step, <= 1e-4 after 256 chained steps; conv state bit-exact (it is a copy of the inputs).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include <encore/ops/kda.h>
#include <encore/ref/kda.h>

#include "kda_test_problem.h"
#include "test_util.h"

namespace encore {
namespace {

using test::DeviceBuffer;
using test::kda::GateRegime;
using test::kda::Problem;

constexpr double kOneStepBound = 1e-5;
constexpr double kChainBound = 1e-4;

// Device copies of a Problem plus per-step buffers for up to `max_batch` rows.
struct DeviceProblem {
  DeviceBuffer<float> conv_weight, A_log, dt_bias, o_norm_weight, conv_state, recurrent_state, proj, y;
  DeviceBuffer<std::uint16_t> f_b, g_b;
  DeviceBuffer<int> slot_ids, error_flag;
  const Problem& prob;
  int max_batch;

  DeviceProblem(const Problem& p, int max_batch_)
      : conv_weight(p.conv_weight), A_log(p.A_log), dt_bias(p.dt_bias), o_norm_weight(p.o_norm_weight),
        conv_state(p.conv_state), recurrent_state(p.recurrent_state), proj(std::size_t(max_batch_) * p.proj_stride),
        y(std::size_t(max_batch_) * p.P()), f_b(p.f_b_bits), g_b(p.g_b_bits), slot_ids(max_batch_), error_flag(1),
        prob(p), max_batch(max_batch_) {
    EXPECT_EQ(cudaSuccess, cudaMemset(error_flag.get(), 0, sizeof(int)));
  }

  ops::KdaParams params(int batch) const {
    ops::KdaParams k;
    k.proj = proj.get(), k.proj_stride = prob.proj_stride, k.slot_ids = slot_ids.get(), k.y = y.get();
    k.conv_weight = conv_weight.get(), k.A_log = A_log.get(), k.dt_bias = dt_bias.get();
    k.f_b_weight = reinterpret_cast<const __nv_bfloat16*>(f_b.get());
    k.g_b_weight = reinterpret_cast<const __nv_bfloat16*>(g_b.get());
    k.o_norm_weight = o_norm_weight.get(), k.conv_state = conv_state.get(), k.recurrent_state = recurrent_state.get();
    k.batch = batch, k.num_heads = prob.H, k.head_dim = prob.D, k.gate_rank = prob.R, k.num_slots = prob.num_slots;
    return k;
  }
  void upload_step(const std::vector<float>& proj_rows, const std::vector<int>& slots) {
    ASSERT_LE(int(slots.size()), max_batch);
    ASSERT_EQ(cudaSuccess, cudaMemcpy(proj.get(), proj_rows.data(), proj_rows.size() * 4, cudaMemcpyHostToDevice));
    ASSERT_EQ(cudaSuccess, cudaMemcpy(slot_ids.get(), slots.data(), slots.size() * 4, cudaMemcpyHostToDevice));
  }
};

std::vector<double> ref_step(Problem& prob, const std::vector<float>& proj, const std::vector<int>& slots) {
  std::vector<double> y(slots.size() * prob.P());
  ref::kda(prob.ref_dims(), prob.ref_weights(), proj.data(), prob.proj_stride, slots.data(), int(slots.size()),
           prob.ref_conv_state.data(), prob.ref_recurrent_state.data(), y.data());
  return y;
}

// Conv state of every slot equals the reference's (which holds exact fp32 copies) bit for bit.
void expect_conv_state_exact(const std::vector<float>& gpu, const std::vector<double>& ref) {
  ASSERT_EQ(gpu.size(), ref.size());
  std::size_t mismatches = 0;
  for (std::size_t i = 0; i < gpu.size(); ++i) mismatches += float(ref[i]) != gpu[i] || std::isnan(gpu[i]);
  EXPECT_EQ(mismatches, 0u) << "conv state differs from the reference in " << mismatches << " of " << gpu.size();
}

// One step: y, recurrent state, conv state against the reference.
void run_one_step(int H, int D, int R, const std::vector<int>& slots, int num_slots, GateRegime regime) {
  const std::uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed << " H=" << H << " D=" << D << " regime=" << int(regime));
  std::mt19937_64 rng(seed);
  Problem prob = test::kda::make_problem(H, D, R, num_slots, rng, regime);
  DeviceProblem dev(prob, int(slots.size()));
  const auto proj = prob.random_proj(int(slots.size()), rng);
  dev.upload_step(proj, slots);
  auto params = dev.params(int(slots.size()));
  params.host_slot_ids = slots.data();
  ENCORE_OK(ops::kda(params, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  const auto y_ref = ref_step(prob, proj, slots);
  const double y_err = test::rel_l2(dev.y.download(), y_ref);
  const double s_err = test::rel_l2(dev.recurrent_state.download(), prob.ref_recurrent_state);
  EXPECT_LE(y_err, kOneStepBound);
  EXPECT_LE(s_err, kOneStepBound);
  expect_conv_state_exact(dev.conv_state.download(), prob.ref_conv_state);
  std::printf("[ one step H=%d D=%d regime=%d B=%zu ] rel_l2 y %.3g  state %.3g\n", H, D, int(regime), slots.size(),
              y_err, s_err);
}

TEST(KdaGpu, OneStepKimiLinearDims) {
  ENCORE_REQUIRE_GPU();
  run_one_step(32, 128, 128, {4, 1, 3}, 6, GateRegime::kRealistic);
}

TEST(KdaGpu, OneStepHeadDim64) {
  ENCORE_REQUIRE_GPU();
  run_one_step(4, 64, 64, {2, 0, 1}, 3, GateRegime::kRealistic);
}

TEST(KdaGpu, OneStepGateExtremes) {
  ENCORE_REQUIRE_GPU();
  for (GateRegime r : {GateRegime::kAlphaNearZero, GateRegime::kAlphaNearOne, GateRegime::kBetaSaturated,
                       GateRegime::kNearZeroK})
    run_one_step(4, 128, 128, {1, 0}, 2, r);
}

// T chained steps, states carried on both sides; y compared every step.
void run_chain(int H, int D, int R, int batch, int steps) {
  const std::uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed << " H=" << H << " D=" << D << " B=" << batch);
  std::mt19937_64 rng(seed);
  const int num_slots = batch + 3;
  Problem prob = test::kda::make_problem(H, D, R, num_slots, rng);
  DeviceProblem dev(prob, batch);
  std::vector<int> slots(num_slots);
  for (int s = 0; s < num_slots; ++s) slots[s] = s;
  std::shuffle(slots.begin(), slots.end(), rng);
  slots.resize(batch);
  double worst_y = 0;
  for (int t = 0; t < steps; ++t) {
    const auto proj = prob.random_proj(batch, rng);
    dev.upload_step(proj, slots);
    dev.y.poison();
    ENCORE_OK(ops::kda(dev.params(batch), nullptr));
    const auto y_ref = ref_step(prob, proj, slots);
    worst_y = std::max(worst_y, test::rel_l2(dev.y.download(), y_ref));
  }
  const double s_err = test::rel_l2(dev.recurrent_state.download(), prob.ref_recurrent_state);
  EXPECT_LE(worst_y, kChainBound);
  EXPECT_LE(s_err, kChainBound);
  expect_conv_state_exact(dev.conv_state.download(), prob.ref_conv_state);
  std::printf("[ chain H=%d D=%d B=%d T=%d ] worst per-step rel_l2 y %.3g, final state %.3g, conv bit-exact\n", H, D,
              batch, steps, worst_y, s_err);
}

TEST(KdaGpu, Chain256StepsB1) {
  ENCORE_REQUIRE_GPU();
  run_chain(2, 128, 128, 1, 256);
}
TEST(KdaGpu, Chain256StepsB3) {
  ENCORE_REQUIRE_GPU();
  run_chain(2, 128, 128, 3, 256);
}
TEST(KdaGpu, Chain256StepsB8) {
  ENCORE_REQUIRE_GPU();
  run_chain(2, 128, 128, 8, 256);
}
TEST(KdaGpu, Chain256StepsHeadDim64B3) {
  ENCORE_REQUIRE_GPU();
  run_chain(4, 64, 64, 3, 256);
}

// A step over slots {2, 5} leaves every other slot bit-identical; a batch {5, 0, 7, -1} with the
// unused slots NaN-poisoned leaves them poisoned, gives y = 0 on the pad row, matches the reference on
// the others; permuting the batch permutes y bitwise.
TEST(KdaGpu, SlotIsolationAndPadding) {
  ENCORE_REQUIRE_GPU();
  const std::uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(seed);
  std::mt19937_64 rng(seed);
  const int H = 2, D = 128, num_slots = 8;
  Problem prob = test::kda::make_problem(H, D, 128, num_slots, rng);
  DeviceProblem dev(prob, 4);
  const std::int64_t rec_per_slot = ops::kda_recurrent_state_floats_per_slot(H, D);
  const std::int64_t conv_per_slot = ops::kda_conv_state_floats_per_slot(H, D);

  {  // {2, 5}
    const std::vector<int> slots = {2, 5};
    const auto proj = prob.random_proj(2, rng);
    dev.upload_step(proj, slots);
    ENCORE_OK(ops::kda(dev.params(2), nullptr));
    const auto rec = dev.recurrent_state.download();
    const auto conv = dev.conv_state.download();
    for (int s = 0; s < num_slots; ++s) {
      const bool used = s == 2 || s == 5;
      const bool rec_same = test::bitwise_equal(&rec[s * rec_per_slot], &prob.recurrent_state[s * rec_per_slot], rec_per_slot * 4);
      const bool conv_same = test::bitwise_equal(&conv[s * conv_per_slot], &prob.conv_state[s * conv_per_slot], conv_per_slot * 4);
      EXPECT_EQ(rec_same, !used) << "recurrent state of slot " << s;
      EXPECT_EQ(conv_same, !used) << "conv state of slot " << s;
    }
  }

  // {5, 0, 7, -1} with unused slots poisoned.
  std::vector<float> rec0 = prob.recurrent_state, conv0 = prob.conv_state;
  for (int s : {1, 2, 3, 4, 6}) {
    std::fill_n(&rec0[s * rec_per_slot], rec_per_slot, NAN);
    std::fill_n(&conv0[s * conv_per_slot], conv_per_slot, NAN);
  }
  prob.ref_recurrent_state.assign(rec0.begin(), rec0.end());
  prob.ref_conv_state.assign(conv0.begin(), conv0.end());
  dev.recurrent_state.upload(rec0);
  dev.conv_state.upload(conv0);
  const std::vector<int> slots = {5, 0, 7, -1};
  const auto proj = prob.random_proj(4, rng);
  dev.upload_step(proj, slots);
  ENCORE_OK(ops::kda(dev.params(4), nullptr));
  const auto y = dev.y.download();
  const auto rec = dev.recurrent_state.download();
  const auto conv = dev.conv_state.download();
  const auto y_ref = ref_step(prob, proj, slots);
  for (int s : {1, 2, 3, 4, 6}) {
    EXPECT_TRUE(test::bitwise_equal(&rec[s * rec_per_slot], &rec0[s * rec_per_slot], rec_per_slot * 4)) << s;
    EXPECT_TRUE(test::bitwise_equal(&conv[s * conv_per_slot], &conv0[s * conv_per_slot], conv_per_slot * 4)) << s;
  }
  for (std::int64_t c = 0; c < prob.P(); ++c) ASSERT_EQ(y[3 * prob.P() + c], 0.f) << "pad row y[" << c << "]";
  const std::vector<float> y_live(y.begin(), y.begin() + 3 * prob.P());
  const std::vector<double> y_ref_live(y_ref.begin(), y_ref.begin() + 3 * prob.P());
  EXPECT_LE(test::rel_l2(y_live, y_ref_live), kOneStepBound);
  for (int s : {0, 5, 7}) {
    const std::vector<float> g(rec.begin() + s * rec_per_slot, rec.begin() + (s + 1) * rec_per_slot);
    const std::vector<double> r(prob.ref_recurrent_state.begin() + s * rec_per_slot,
                                prob.ref_recurrent_state.begin() + (s + 1) * rec_per_slot);
    EXPECT_LE(test::rel_l2(g, r), kOneStepBound) << "slot " << s;
  }

  // Permutation: same start states, rows permuted to {-1, 7, 5, 0}: outputs permute bitwise.
  dev.recurrent_state.upload(rec0);
  dev.conv_state.upload(conv0);
  const std::vector<int> perm = {3, 2, 0, 1};  // new row r takes old row perm[r]
  std::vector<float> proj_p(proj.size());
  std::vector<int> slots_p(4);
  for (int r = 0; r < 4; ++r) {
    std::copy_n(&proj[perm[r] * prob.proj_stride], prob.proj_stride, &proj_p[r * prob.proj_stride]);
    slots_p[r] = slots[perm[r]];
  }
  dev.upload_step(proj_p, slots_p);
  dev.y.poison();
  ENCORE_OK(ops::kda(dev.params(4), nullptr));
  const auto y_p = dev.y.download();
  for (int r = 0; r < 4; ++r)
    EXPECT_TRUE(test::bitwise_equal(&y_p[r * prob.P()], &y[perm[r] * prob.P()], prob.P() * 4)) << "row " << r;
  EXPECT_TRUE(test::bitwise_equal(dev.recurrent_state.download().data(), rec.data(), rec.size() * 4));
}

// A captured step (slot check + kernel) replayed K times equals K eager steps bit for bit, and
// repeated eager runs are bit-identical. Then the device slot ids are made invalid and the same
// graph is replayed: the check flags it, no state changes, y is NaN.
TEST(KdaGpu, GraphReplayMatchesEagerAndHonoursSlotCheck) {
  ENCORE_REQUIRE_GPU();
  const std::uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(seed);
  std::mt19937_64 rng(seed);
  const int H = 4, D = 128, batch = 3, steps = 4;
  Problem prob = test::kda::make_problem(H, D, 128, 5, rng);
  DeviceProblem dev(prob, batch);
  const std::vector<int> slots = {3, -1, 0};
  dev.upload_step(prob.random_proj(batch, rng), slots);
  auto params = dev.params(batch);
  params.error_flag = dev.error_flag.get();

  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  auto eager = [&](std::vector<float>& y_out, std::vector<float>& state_out) {
    dev.recurrent_state.upload(prob.recurrent_state);
    dev.conv_state.upload(prob.conv_state);
    for (int t = 0; t < steps; ++t) ENCORE_OK(ops::kda(params, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    y_out = dev.y.download();
    state_out = dev.recurrent_state.download();
  };
  std::vector<float> y_a, s_a, y_b, s_b;
  eager(y_a, s_a);
  eager(y_b, s_b);
  EXPECT_TRUE(test::bitwise_equal(y_a.data(), y_b.data(), y_a.size() * 4)) << "eager runs differ";
  EXPECT_TRUE(test::bitwise_equal(s_a.data(), s_b.data(), s_a.size() * 4)) << "eager runs differ";
  ENCORE_OK(ops::kda_read_error(dev.error_flag.get(), stream));

  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  ENCORE_OK(ops::kda(params, stream));
  CUDA_OK(cudaStreamEndCapture(stream, &graph));
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  dev.recurrent_state.upload(prob.recurrent_state);
  dev.conv_state.upload(prob.conv_state);
  dev.y.poison();
  for (int t = 0; t < steps; ++t) CUDA_OK(cudaGraphLaunch(exec, stream));
  CUDA_OK(cudaStreamSynchronize(stream));
  const auto y_g = dev.y.download();
  const auto s_g = dev.recurrent_state.download();
  EXPECT_TRUE(test::bitwise_equal(y_g.data(), y_a.data(), y_a.size() * 4)) << "graph replay differs from eager";
  EXPECT_TRUE(test::bitwise_equal(s_g.data(), s_a.data(), s_a.size() * 4)) << "graph replay differs from eager";
  ENCORE_OK(ops::kda_read_error(dev.error_flag.get(), stream));

  // Invalid device slot ids under the same graph: duplicate, then out of range.
  for (const std::vector<int>& bad : {std::vector<int>{3, -1, 3}, std::vector<int>{3, 5, 0}}) {
    const auto rec_before = dev.recurrent_state.download();
    const auto conv_before = dev.conv_state.download();
    CUDA_OK(cudaMemcpy(dev.slot_ids.get(), bad.data(), bad.size() * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaGraphLaunch(exec, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    const auto rec_after = dev.recurrent_state.download();
    const auto conv_after = dev.conv_state.download();
    EXPECT_TRUE(test::bitwise_equal(rec_after.data(), rec_before.data(), rec_after.size() * 4));
    EXPECT_TRUE(test::bitwise_equal(conv_after.data(), conv_before.data(), conv_after.size() * 4));
    for (float v : dev.y.download()) ASSERT_TRUE(std::isnan(v)) << "y must be NaN after a failed slot check";
    const Status st = ops::kda_read_error(dev.error_flag.get(), stream);
    EXPECT_EQ(st.code(), bad[1] == 5 ? StatusCode::kOutOfRange : StatusCode::kInvalidArgument) << st.to_string();
    ENCORE_OK(ops::kda_read_error(dev.error_flag.get(), stream));  // cleared
  }
  CUDA_OK(cudaGraphExecDestroy(exec));
  CUDA_OK(cudaGraphDestroy(graph));
  CUDA_OK(cudaStreamDestroy(stream));
}

// state_settled: steps alternating between two disjoint slot sets, each with its own slot ids and
// y, launched back to back (PDL, no slot check), so every step's states were last written two
// kernels earlier, as the flag requires. The results equal the unsettled run's bit for bit.
TEST(KdaGpu, SettledStatesMatchUnsettled) {
  ENCORE_REQUIRE_GPU();
  const std::uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(seed);
  std::mt19937_64 rng(seed);
  const int H = 32, D = 128, batch = 3, steps = 6;
  Problem prob = test::kda::make_problem(H, D, 128, 6, rng);
  DeviceProblem dev(prob, batch);
  const std::vector<int> sets[2] = {{3, -1, 0}, {1, 4, 2}};
  DeviceBuffer<int> slot_ids[2] = {DeviceBuffer<int>(sets[0]), DeviceBuffer<int>(sets[1])};
  DeviceBuffer<float> y[2] = {DeviceBuffer<float>(std::size_t(batch) * prob.P()), DeviceBuffer<float>(std::size_t(batch) * prob.P())};
  dev.upload_step(prob.random_proj(batch, rng), sets[0]);
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  auto run = [&](bool settled, std::vector<float> (&y_out)[2], std::vector<float>& state_out, std::vector<float>& conv_out) {
    dev.recurrent_state.upload(prob.recurrent_state);
    dev.conv_state.upload(prob.conv_state);
    y[0].poison(), y[1].poison();
    for (int t = 0; t < steps; ++t) {
      auto params = dev.params(batch);
      params.slot_ids = slot_ids[t % 2].get(), params.y = y[t % 2].get(), params.state_settled = settled;
      ENCORE_OK(ops::kda(params, stream));
    }
    CUDA_OK(cudaStreamSynchronize(stream));
    y_out[0] = y[0].download(), y_out[1] = y[1].download();
    state_out = dev.recurrent_state.download(), conv_out = dev.conv_state.download();
  };
  std::vector<float> y_u[2], y_s[2], s_u, s_s, c_u, c_s;
  run(false, y_u, s_u, c_u);
  run(true, y_s, s_s, c_s);
  for (int k = 0; k < 2; ++k) EXPECT_TRUE(test::bitwise_equal(y_s[k].data(), y_u[k].data(), y_u[k].size() * 4)) << "y of set " << k;
  EXPECT_TRUE(test::bitwise_equal(s_s.data(), s_u.data(), s_u.size() * 4)) << "recurrent state";
  EXPECT_TRUE(test::bitwise_equal(c_s.data(), c_u.data(), c_u.size() * 4)) << "conv state";
  CUDA_OK(cudaStreamDestroy(stream));
}

// Bad slot ids through each path leave every state untouched.
TEST(KdaGpu, BadSlotIdsLeaveStatesUntouched) {
  ENCORE_REQUIRE_GPU();
  const std::uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(seed);
  std::mt19937_64 rng(seed);
  Problem prob = test::kda::make_problem(2, 64, 64, 4, rng);
  DeviceProblem dev(prob, 3);
  const std::vector<std::vector<int>> bad = {{0, 4, 1}, {2, 1, 2}, {1 << 30, 0, 1}};
  for (const auto& slots : bad) {
    SCOPED_TRACE(::testing::Message() << slots[0] << "," << slots[1] << "," << slots[2]);
    dev.upload_step(prob.random_proj(3, rng), slots);
    // (a) host copy given: the launcher refuses, nothing is launched (y stays poisoned).
    auto params = dev.params(3);
    params.host_slot_ids = slots.data();
    dev.y.poison();
    const Status st = ops::kda(params, nullptr);
    EXPECT_FALSE(st.ok());
    for (float v : dev.y.download()) {
      std::uint32_t bits;
      std::memcpy(&bits, &v, 4);
      ASSERT_EQ(bits, 0xffffffffu) << "the launcher refused, yet y was written";
    }
    // (b) device check: launched, flagged, nothing written.
    params.host_slot_ids = nullptr;
    params.error_flag = dev.error_flag.get();
    ENCORE_OK(ops::kda(params, nullptr));
    EXPECT_FALSE(ops::kda_read_error(dev.error_flag.get(), nullptr).ok());
    EXPECT_TRUE(test::bitwise_equal(dev.recurrent_state.download().data(), prob.recurrent_state.data(),
                                    prob.recurrent_state.size() * 4));
    EXPECT_TRUE(test::bitwise_equal(dev.conv_state.download().data(), prob.conv_state.data(), prob.conv_state.size() * 4));
    for (float v : dev.y.download()) ASSERT_TRUE(std::isnan(v));
  }
  // (c) no check at all: an out-of-range id only skips its own row (y NaN), never writes out of
  // bounds (compute-sanitizer memcheck runs this test); the valid rows are updated.
  const std::vector<int> slots = {0, 1 << 30, 3};
  const auto proj = prob.random_proj(3, rng);
  dev.upload_step(proj, slots);
  ENCORE_OK(ops::kda(dev.params(3), nullptr));
  const auto y = dev.y.download();
  for (std::int64_t c = 0; c < prob.P(); ++c) ASSERT_TRUE(std::isnan(y[prob.P() + c]));
  const auto rec = dev.recurrent_state.download();
  const std::int64_t per_slot = ops::kda_recurrent_state_floats_per_slot(2, 64);
  EXPECT_TRUE(test::bitwise_equal(&rec[per_slot], &prob.recurrent_state[per_slot], 2 * per_slot * 4));  // slots 1, 2
  EXPECT_FALSE(test::bitwise_equal(&rec[0], &prob.recurrent_state[0], per_slot * 4));                 // slot 0 stepped
}

// Import [K][V] -> pool -> export [K][V] is bit-exact and lands in V-first order; reset zeroes only
// the listed slots (a negative id is skipped).
TEST(KdaGpu, StateHelpers) {
  ENCORE_REQUIRE_GPU();
  const std::uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(seed);
  std::mt19937_64 rng(seed);
  for (int D : {64, 128}) {
    const int H = 3, num_slots = 4;
    const std::int64_t per_slot = ops::kda_recurrent_state_floats_per_slot(H, D);
    const std::int64_t conv_per_slot = ops::kda_conv_state_floats_per_slot(H, D);
    const auto pool0 = test::random_normal(per_slot * num_slots, rng);
    const auto conv0 = test::random_normal(conv_per_slot * num_slots, rng);
    DeviceBuffer<float> pool(pool0), conv(conv0);
    const auto kv = test::random_normal(per_slot, rng);
    DeviceBuffer<float> kv_in(kv), kv_out(per_slot);
    ENCORE_OK(ops::kda_import_state_kv(pool.get(), num_slots, H, D, 2, kv_in.get(), nullptr));
    ENCORE_OK(ops::kda_export_state_kv(pool.get(), num_slots, H, D, 2, kv_out.get(), nullptr));
    const auto back = kv_out.download();
    EXPECT_TRUE(test::bitwise_equal(back.data(), kv.data(), kv.size() * 4)) << "D=" << D;
    std::vector<float> vk(per_slot);
    ref::kda_state_kv_to_vk(H, D, kv.data(), vk.data());
    const auto pooled = pool.download();
    EXPECT_TRUE(test::bitwise_equal(&pooled[2 * per_slot], vk.data(), per_slot * 4)) << "D=" << D;
    EXPECT_TRUE(test::bitwise_equal(pooled.data(), pool0.data(), 2 * per_slot * 4));

    // Own layout copies and conv history in both layouts round-trip bit for bit.
    ENCORE_OK(ops::kda_export_state_vk(pool.get(), num_slots, H, D, 2, kv_out.get(), nullptr));
    EXPECT_TRUE(test::bitwise_equal(kv_out.download().data(), vk.data(), per_slot * 4)) << "export vk, D=" << D;
    DeviceBuffer<float> saved(per_slot);
    ENCORE_OK(ops::kda_export_state_vk(pool.get(), num_slots, H, D, 0, saved.get(), nullptr));
    ENCORE_OK(ops::kda_import_state_vk(pool.get(), num_slots, H, D, 0, kv_in.get(), nullptr));
    EXPECT_TRUE(test::bitwise_equal(pool.download().data(), kv.data(), per_slot * 4)) << "import vk, D=" << D;
    ENCORE_OK(ops::kda_import_state_vk(pool.get(), num_slots, H, D, 0, saved.get(), nullptr));  // restore slot 0
    EXPECT_TRUE(test::bitwise_equal(pool.download().data(), pool0.data(), per_slot * 4)) << "restore, D=" << D;
    const auto conv_cm = test::random_normal(conv_per_slot, rng);  // [C][3]
    const std::int64_t C = conv_per_slot / 3;
    DeviceBuffer<float> conv_in(conv_cm), conv_out(conv_per_slot);
    ENCORE_OK(ops::kda_import_conv_state(conv.get(), num_slots, H, D, 1, conv_in.get(),
                                         ops::KdaConvLayout::kChannelMajor, nullptr));
    const auto c1 = conv.download();
    for (std::int64_t c = 0; c < C; ++c)
      for (int t = 0; t < 3; ++t)
        ASSERT_EQ(c1[conv_per_slot + t * C + c], conv_cm[c * 3 + t]) << "tap " << t << " channel " << c;
    EXPECT_TRUE(test::bitwise_equal(c1.data(), conv0.data(), conv_per_slot * 4));  // slot 0 untouched
    EXPECT_TRUE(test::bitwise_equal(&c1[2 * conv_per_slot], &conv0[2 * conv_per_slot], 2 * conv_per_slot * 4));
    ENCORE_OK(ops::kda_export_conv_state(conv.get(), num_slots, H, D, 1, conv_out.get(),
                                         ops::KdaConvLayout::kChannelMajor, nullptr));
    EXPECT_TRUE(test::bitwise_equal(conv_out.download().data(), conv_cm.data(), conv_per_slot * 4));
    ENCORE_OK(ops::kda_export_conv_state(conv.get(), num_slots, H, D, 1, conv_out.get(), ops::KdaConvLayout::kTapMajor,
                                         nullptr));
    EXPECT_TRUE(test::bitwise_equal(conv_out.download().data(), &c1[conv_per_slot], conv_per_slot * 4));
    DeviceBuffer<float> conv_tm(std::vector<float>(conv0.begin() + conv_per_slot, conv0.begin() + 2 * conv_per_slot));
    ENCORE_OK(ops::kda_import_conv_state(conv.get(), num_slots, H, D, 1, conv_tm.get(), ops::KdaConvLayout::kTapMajor,
                                         nullptr));  // back to the start values
    EXPECT_TRUE(test::bitwise_equal(conv.download().data(), conv0.data(), conv0.size() * 4));

    const std::vector<int> reset = {3, -1, 1};
    DeviceBuffer<int> reset_ids(reset);
    ENCORE_OK(ops::kda_reset_slots(pool.get(), conv.get(), num_slots, H, D, reset_ids.get(), 3, nullptr));
    const auto p2 = pool.download();
    const auto c2 = conv.download();
    for (int s = 0; s < num_slots; ++s) {
      const bool zeroed = s == 1 || s == 3;
      bool all_zero = true;
      for (std::int64_t i = 0; i < per_slot; ++i) all_zero &= p2[s * per_slot + i] == 0.f;
      for (std::int64_t i = 0; i < conv_per_slot; ++i) all_zero &= c2[s * conv_per_slot + i] == 0.f;
      EXPECT_EQ(all_zero, zeroed) << "slot " << s;
      if (!zeroed)
        EXPECT_TRUE(test::bitwise_equal(&c2[s * conv_per_slot], &conv0[s * conv_per_slot], conv_per_slot * 4)) << s;
    }
  }
}

// A slot whose states are set from outside (recurrent state in [K][V], conv history channel-major)
// steps exactly like the reference started from those states; a reset slot steps like a fresh one.
TEST(KdaGpu, SetStatesThenStep) {
  ENCORE_REQUIRE_GPU();
  const std::uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(seed);
  std::mt19937_64 rng(seed);
  const int H = 2, D = 128, num_slots = 3;
  Problem prob = test::kda::make_problem(H, D, 128, num_slots, rng);
  DeviceProblem dev(prob, 2);
  const std::int64_t per_slot = ops::kda_recurrent_state_floats_per_slot(H, D);
  const std::int64_t conv_per_slot = ops::kda_conv_state_floats_per_slot(H, D), C = conv_per_slot / 3;
  const auto kv = test::random_normal(per_slot, rng, 0.f, 0.05f);
  const auto conv_cm = test::random_normal(conv_per_slot, rng);
  DeviceBuffer<float> kv_dev(kv), conv_dev(conv_cm);
  ENCORE_OK(ops::kda_import_state_kv(dev.recurrent_state.get(), num_slots, H, D, 1, kv_dev.get(), nullptr));
  ENCORE_OK(ops::kda_import_conv_state(dev.conv_state.get(), num_slots, H, D, 1, conv_dev.get(),
                                       ops::KdaConvLayout::kChannelMajor, nullptr));
  const std::vector<int> reset_ids = {2};
  DeviceBuffer<int> reset_dev(reset_ids);
  ENCORE_OK(ops::kda_reset_slots(dev.recurrent_state.get(), dev.conv_state.get(), num_slots, H, D, reset_dev.get(), 1,
                                 nullptr));
  // The reference starts from the same states.
  std::vector<float> vk(per_slot);
  ref::kda_state_kv_to_vk(H, D, kv.data(), vk.data());
  std::copy(vk.begin(), vk.end(), prob.ref_recurrent_state.begin() + per_slot);
  for (std::int64_t c = 0; c < C; ++c)
    for (int t = 0; t < 3; ++t) prob.ref_conv_state[conv_per_slot + t * C + c] = conv_cm[c * 3 + t];
  std::fill_n(prob.ref_recurrent_state.begin() + 2 * per_slot, per_slot, 0.0);
  std::fill_n(prob.ref_conv_state.begin() + 2 * conv_per_slot, conv_per_slot, 0.0);

  const std::vector<int> slots = {2, 1};
  for (int t = 0; t < 4; ++t) {
    const auto proj = prob.random_proj(2, rng);
    dev.upload_step(proj, slots);
    dev.y.poison();
    ENCORE_OK(ops::kda(dev.params(2), nullptr));
    const auto y_ref = ref_step(prob, proj, slots);
    EXPECT_LE(test::rel_l2(dev.y.download(), y_ref), kOneStepBound) << "step " << t;
  }
  EXPECT_LE(test::rel_l2(dev.recurrent_state.download(), prob.ref_recurrent_state), kOneStepBound);
  expect_conv_state_exact(dev.conv_state.download(), prob.ref_conv_state);
}

}  // namespace
}  // namespace encore
