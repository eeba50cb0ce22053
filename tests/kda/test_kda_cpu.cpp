// CPU tests of the KDA op: reference self-checks, layout helpers, argument validation (all run
// without a GPU: the launcher rejects bad input before touching CUDA).
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include <encore/ops/kda.h>
#include <encore/ref/kda.h>

#include "kda_test_problem.h"
#include "test_util.h"

namespace encore {
namespace {

using test::kda::GateRegime;

// Matrix form (explicit K x K transition) and single-pass form agree to 1e-12 (relative L2),
// for o and for the updated state.
TEST(KdaRef, MatrixFormMatchesSinglePass) {
  const std::uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(seed);
  std::mt19937_64 rng(seed);
  for (int D : {64, 128}) {
    std::vector<float> a = test::random_uniform(D, rng, 0.01f, 1.f), kf = test::random_normal(D, rng),
                       qf = test::random_normal(D, rng), vf = test::random_normal(D, rng),
                       sf = test::random_normal(std::size_t(D) * D, rng, 0.f, 0.1f);
    std::vector<double> alpha(a.begin(), a.end()), k(kf.begin(), kf.end()), q(qf.begin(), qf.end()),
        v(vf.begin(), vf.end()), s1(sf.begin(), sf.end()), s2 = s1;
    double kn = 0, qn = 0;
    for (int j = 0; j < D; ++j) kn += k[j] * k[j], qn += q[j] * q[j];
    for (int j = 0; j < D; ++j) k[j] /= std::sqrt(kn + 1e-6), q[j] /= std::sqrt(qn + 1e-6) * std::sqrt(double(D));
    const double beta = 0.7;
    const auto o1 = ref::kda_recurrence_matrix_form(D, alpha.data(), beta, k.data(), q.data(), v.data(), s1.data());
    const auto o2 = ref::kda_recurrence_single_pass(D, alpha.data(), beta, k.data(), q.data(), v.data(), s2.data());
    EXPECT_LE(test::rel_l2(o1, o2), 1e-12) << "D=" << D;
    EXPECT_LE(test::rel_l2(s1, s2), 1e-12) << "D=" << D;
    // The update must actually change the state (a test that cannot fail is a defect).
    EXPECT_GT(test::rel_l2(s1, std::vector<double>(sf.begin(), sf.end())), 1e-3);
  }
}

// Feeding x_1..x_6 through the reference from a zero history: after each step the history holds
// the last three raw inputs (oldest first) and the conv equals the direct 4-tap causal conv.
TEST(KdaRef, ConvHistoryMatchesDirectConvolution) {
  const std::uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(seed);
  std::mt19937_64 rng(seed);
  auto prob = test::kda::make_problem(1, 64, 8, 1, rng);
  std::fill(prob.ref_conv_state.begin(), prob.ref_conv_state.end(), 0.0);
  const std::int64_t C = 3 * prob.P();
  std::vector<std::vector<float>> xs;
  std::vector<double> y(prob.P());
  const int slot = 0;
  for (int t = 0; t < 6; ++t) {
    xs.push_back(prob.random_proj(1, rng));
    ref::kda(prob.ref_dims(), prob.ref_weights(), xs.back().data(), prob.proj_stride, &slot, 1,
             prob.ref_conv_state.data(), prob.ref_recurrent_state.data(), y.data());
    for (std::int64_t c = 0; c < C; c += 37) {
      for (int tap = 0; tap < 3; ++tap) {
        const int src = t - 2 + tap;  // token index held by this tap
        const double expect = src >= 0 ? double(xs[src][c]) : 0.0;
        ASSERT_EQ(prob.ref_conv_state[tap * C + c], expect) << "t=" << t << " c=" << c << " tap=" << tap;
      }
      // direct conv at step t: sum_j w[j] x_{t-3+j}
      double direct = 0;
      for (int j = 0; j < 4; ++j) {
        const int src = t - 3 + j;
        if (src >= 0) direct += double(prob.conv_weight[4 * c + j]) * double(xs[src][c]);
      }
      double hist[3];
      for (int tap = 0; tap < 3; ++tap) {
        const int src = t - 3 + tap;
        hist[tap] = src >= 0 ? double(xs[src][c]) : 0.0;
      }
      EXPECT_NEAR(ref::kda_conv_channel(hist, xs[t][c], &prob.conv_weight[4 * c]), direct, 1e-12);
    }
  }
}

// Pad rows give y = 0 and leave the reference states alone.
TEST(KdaRef, PadRowTouchesNothing) {
  const std::uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(seed);
  std::mt19937_64 rng(seed);
  auto prob = test::kda::make_problem(2, 64, 16, 2, rng);
  const auto conv0 = prob.ref_conv_state;
  const auto state0 = prob.ref_recurrent_state;
  const auto proj = prob.random_proj(1, rng);
  const int slot = -1;
  std::vector<double> y(prob.P(), 1.0);
  ref::kda(prob.ref_dims(), prob.ref_weights(), proj.data(), prob.proj_stride, &slot, 1, prob.ref_conv_state.data(),
           prob.ref_recurrent_state.data(), y.data());
  EXPECT_EQ(prob.ref_conv_state, conv0);
  EXPECT_EQ(prob.ref_recurrent_state, state0);
  for (double v : y) EXPECT_EQ(v, 0.0);
}

TEST(KdaRef, LayoutTransposeRoundTrip) {
  const std::uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(seed);
  std::mt19937_64 rng(seed);
  const int H = 3, D = 64;
  const auto kv = test::random_normal(std::size_t(H) * D * D, rng);
  std::vector<float> vk(kv.size()), back(kv.size());
  ref::kda_state_kv_to_vk(H, D, kv.data(), vk.data());
  EXPECT_EQ(vk[(std::size_t(1) * D + 5) * D + 7], kv[(std::size_t(1) * D + 7) * D + 5]);  // S[k=7][v=5] of head 1
  ref::kda_state_vk_to_kv(H, D, vk.data(), back.data());
  EXPECT_TRUE(test::bitwise_equal(back.data(), kv.data(), kv.size() * 4));
}

// ---- argument validation: every case fails with its code before any CUDA call -------------------

class KdaValidation : public ::testing::Test {
 protected:
  // Fake, 256-byte-aligned, disjoint device addresses: validation never dereferences them.
  static void* fake(std::uintptr_t region) { return reinterpret_cast<void*>((region + 1) << 32); }
  ops::KdaParams good() const {
    ops::KdaParams p;
    p.batch = 3, p.num_heads = 32, p.head_dim = 128, p.gate_rank = 128, p.num_slots = 8;
    p.proj_stride = ops::kda_proj_width(p);
    p.proj = static_cast<const float*>(fake(1));
    p.slot_ids = static_cast<const int*>(fake(2));
    p.y = static_cast<float*>(fake(3));
    p.conv_weight = static_cast<const float*>(fake(4));
    p.A_log = static_cast<const float*>(fake(5));
    p.dt_bias = static_cast<const float*>(fake(6));
    p.f_b_weight = static_cast<const __nv_bfloat16*>(fake(7));
    p.g_b_weight = static_cast<const __nv_bfloat16*>(fake(8));
    p.o_norm_weight = static_cast<const float*>(fake(9));
    p.conv_state = static_cast<float*>(fake(10));
    p.recurrent_state = static_cast<float*>(fake(11));
    return p;
  }
  static void expect_code(const ops::KdaParams& p, StatusCode code, const char* what) {
    const Status st = ops::kda(p, nullptr);
    EXPECT_EQ(st.code(), code) << what << ": " << st.to_string();
    EXPECT_FALSE(st.message().empty()) << what;
  }
};

TEST_F(KdaValidation, GoodParamsPassValidation) { ENCORE_OK(ops::kda_validate(good())); }

TEST_F(KdaValidation, RejectsBadDims) {
  auto p = good();
  p.head_dim = 96;
  expect_code(p, StatusCode::kInvalidArgument, "head_dim 96");
  p = good(), p.head_dim = 256;
  expect_code(p, StatusCode::kInvalidArgument, "head_dim 256");
  p = good(), p.num_heads = 0;
  expect_code(p, StatusCode::kInvalidArgument, "num_heads 0");
  p = good(), p.gate_rank = 96;
  p.proj_stride = ops::kda_proj_width(p);
  expect_code(p, StatusCode::kInvalidArgument, "gate_rank 96");
  p = good(), p.gate_rank = 512;
  p.proj_stride = ops::kda_proj_width(p);
  expect_code(p, StatusCode::kInvalidArgument, "gate_rank 512");
  p = good(), p.batch = 0;
  expect_code(p, StatusCode::kOutOfRange, "batch 0");
  p = good(), p.num_slots = 0;
  expect_code(p, StatusCode::kInvalidArgument, "num_slots 0");
  p = good(), p.proj_stride -= 4;
  expect_code(p, StatusCode::kInvalidArgument, "proj_stride too small");
  p = good(), p.proj_stride += 1;
  expect_code(p, StatusCode::kInvalidArgument, "proj_stride not a multiple of 4");
  p = good(), p.norm_eps = 0.f;
  expect_code(p, StatusCode::kInvalidArgument, "norm_eps 0");
}

TEST_F(KdaValidation, RejectsNullAndMisalignedPointers) {
  auto p = good();
  p.proj = nullptr;
  expect_code(p, StatusCode::kNullPointer, "null proj");
  p = good(), p.slot_ids = nullptr;
  expect_code(p, StatusCode::kNullPointer, "null slot_ids");
  p = good(), p.y = nullptr;
  expect_code(p, StatusCode::kNullPointer, "null y");
  p = good(), p.f_b_weight = nullptr;
  expect_code(p, StatusCode::kNullPointer, "null f_b_weight");
  p = good(), p.recurrent_state = nullptr;
  expect_code(p, StatusCode::kNullPointer, "null recurrent_state");
  p = good(), p.conv_state = nullptr;
  expect_code(p, StatusCode::kNullPointer, "null conv_state");
  p = good(), p.recurrent_state += 1;
  expect_code(p, StatusCode::kMisaligned, "recurrent_state + 4 bytes");
  p = good(), p.conv_state += 2;
  expect_code(p, StatusCode::kMisaligned, "conv_state + 8 bytes");
  p = good(), p.proj += 1;
  expect_code(p, StatusCode::kMisaligned, "proj + 4 bytes");
  p = good(), p.g_b_weight += 4;
  expect_code(p, StatusCode::kMisaligned, "g_b_weight + 8 bytes");
  p = good(), p.error_flag = reinterpret_cast<int*>(reinterpret_cast<char*>(fake(12)) + 2);
  expect_code(p, StatusCode::kMisaligned, "error_flag + 2 bytes");
}

TEST_F(KdaValidation, RejectsOverlappingBuffers) {
  auto p = good();
  p.y = p.recurrent_state + 64;
  expect_code(p, StatusCode::kOverlap, "y inside recurrent_state");
  p = good(), p.conv_state = const_cast<float*>(p.proj);
  expect_code(p, StatusCode::kOverlap, "conv_state == proj");
  p = good(), p.error_flag = const_cast<int*>(p.slot_ids);
  expect_code(p, StatusCode::kOverlap, "error_flag == slot_ids");
}

TEST_F(KdaValidation, RejectsBadHostSlotIds) {
  auto p = good();
  const int out_of_range[3] = {0, 8, 1};
  p.host_slot_ids = out_of_range;
  expect_code(p, StatusCode::kOutOfRange, "slot id == num_slots");
  const int duplicate[3] = {3, -1, 3};
  p.host_slot_ids = duplicate;
  expect_code(p, StatusCode::kInvalidArgument, "duplicate slot id");
  const int fine[3] = {7, -1, -1};  // several pad rows are not duplicates
  p.host_slot_ids = fine;
  ENCORE_OK(ops::kda_validate(p));
}

TEST_F(KdaValidation, HelpersRejectBadInput) {
  auto* state = static_cast<float*>(fake(20));
  auto* conv = static_cast<float*>(fake(21));
  const auto* ids = static_cast<const int*>(fake(22));
  EXPECT_EQ(ops::kda_reset_slots(state, conv, 4, 32, 96, ids, 2, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ops::kda_reset_slots(state, conv, 4, 32, 128, nullptr, 2, nullptr).code(), StatusCode::kNullPointer);
  EXPECT_EQ(ops::kda_reset_slots(state, state, 4, 32, 128, ids, 2, nullptr).code(), StatusCode::kOverlap);
  EXPECT_EQ(ops::kda_import_state_kv(state, 4, 32, 128, 4, conv, nullptr).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(ops::kda_export_state_kv(state, 4, 32, 128, -1, conv, nullptr).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(ops::kda_export_state_kv(state + 1, 4, 32, 128, 0, conv, nullptr).code(), StatusCode::kMisaligned);
  EXPECT_EQ(ops::kda_check_slots(ids, 0, 4, static_cast<int*>(fake(23)), nullptr).code(), StatusCode::kInvalidArgument);
  using ops::KdaConvLayout;
  EXPECT_EQ(ops::kda_import_conv_state(conv, 4, 32, 128, 4, state, KdaConvLayout::kTapMajor, nullptr).code(),
            StatusCode::kOutOfRange);
  EXPECT_EQ(ops::kda_import_conv_state(conv, 4, 32, 96, 0, state, KdaConvLayout::kTapMajor, nullptr).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ops::kda_import_conv_state(conv, 4, 32, 128, 0, nullptr, KdaConvLayout::kChannelMajor, nullptr).code(),
            StatusCode::kNullPointer);
  EXPECT_EQ(ops::kda_export_conv_state(conv + 1, 4, 32, 128, 0, state, KdaConvLayout::kTapMajor, nullptr).code(),
            StatusCode::kMisaligned);
  EXPECT_EQ(ops::kda_export_conv_state(conv, 4, 32, 128, 0, conv + 4, KdaConvLayout::kTapMajor, nullptr).code(),
            StatusCode::kOverlap);
  EXPECT_EQ(ops::kda_import_state_vk(state, 4, 32, 128, -1, conv, nullptr).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(ops::kda_export_state_vk(state, 4, 32, 128, 2, state + 2 * ops::kda_recurrent_state_floats_per_slot(32, 128),
                                     nullptr).code(),
            StatusCode::kOverlap);
}


TEST_F(KdaValidation, ConvLayoutOutsideTheEnumIsRejected) {
  float* pool = static_cast<float*>(fake(20));
  float* buffer = static_cast<float*>(fake(21));
  const Status in = ops::kda_import_conv_state(pool, 4, 2, 64, 1, buffer, ops::KdaConvLayout(9), nullptr);
  EXPECT_EQ(in.code(), StatusCode::kInvalidArgument) << in.to_string();
  EXPECT_NE(in.message().find("kda_import_conv_state: layout"), std::string::npos) << in.message();
  EXPECT_EQ(ops::kda_export_conv_state(pool, 4, 2, 64, 1, buffer, ops::KdaConvLayout(9), nullptr).code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace encore
