// CPU tests of the MLA decode ops: scheduler plan invariants, RoPE/YaRN, the absorbed-vs-as-trained
// identity in double precision, and launcher validation (fails before any launch, so no GPU needed).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include <encore/ops/mla.h>
#include <encore/ref/mla.h>

#include "mla/mla_plan.h"
#include "test_util.h"

namespace encore {
namespace {

using namespace encore::ops;

// Every page of every request covered exactly once, in split order; total splits <= N + P.
void check_plan(const std::vector<std::int32_t>& lens, int parts, int overhead, int min_units = 1) {
  SCOPED_TRACE(::testing::Message() << "N=" << lens.size() << " P=" << parts << " C=" << overhead << " M=" << min_units);
  const ref::MlaSchedule s = ref::mla_sched(lens, parts, overhead, min_units);
  const int n = int(lens.size());
  ASSERT_EQ(s.num_splits[0], 0);
  for (int b = 0; b < n; ++b) ASSERT_GE(s.num_splits[b + 1] - s.num_splits[b], 1) << "request " << b;
  ASSERT_LE(s.num_splits[n], n + parts);
  std::vector<std::vector<int>> covered(n);
  std::vector<std::vector<int>> split_seen(n);
  for (int b = 0; b < n; ++b) covered[b].assign(std::max((lens[b] + 63) / 64, 1), 0);
  int total = 0;
  for (int b = 0; b < n; ++b) total += int(covered[b].size()) + overhead;
  const int unit = mla::plan_unit(total, parts, min_units);
  for (int part = 0; part < parts; ++part) {
    const ops::MlaPartPlan& m = s.parts[std::size_t(part)];
    if (m.begin_req < 0) continue;  // no work (only overhead units, or past the end)
    ASSERT_LE(m.begin_req, m.end_req);
    // Balance: pages plus the overhead of the requests it starts stay within one unit.
    int work = 0;
    for (int b = m.begin_req; b <= m.end_req; ++b) {
      const int p0 = b == m.begin_req ? m.begin_page : 0, p1 = b == m.end_req ? m.end_page : int(covered[b].size());
      work += p1 - p0 + (p0 == 0 ? overhead : 0);
    }
    ASSERT_LE(work, unit + overhead) << "part " << part;
    for (int b = m.begin_req; b <= m.end_req; ++b) {
      const int pages = int(covered[b].size());
      const int p0 = b == m.begin_req ? m.begin_page : 0, p1 = b == m.end_req ? m.end_page : pages;
      ASSERT_LT(p0, p1) << "empty range, part " << part;
      ASSERT_LE(p1, pages);
      for (int pg = p0; pg < p1; ++pg) covered[b][pg]++;
      split_seen[b].push_back(b == m.begin_req ? m.begin_split : 0);
    }
  }
  for (int b = 0; b < n; ++b) {
    for (int pg = 0; pg < int(covered[b].size()); ++pg) ASSERT_EQ(covered[b][pg], 1) << "request " << b << " page " << pg;
    const int splits = s.num_splits[b + 1] - s.num_splits[b];
    ASSERT_EQ(int(split_seen[b].size()), splits) << "request " << b;
    for (int i = 0; i < splits; ++i) ASSERT_EQ(split_seen[b][i], i) << "request " << b;
  }
}

TEST(MlaSchedCpu, CoversEveryPageOnceAcrossShapes) {
  std::mt19937_64 rng(test::fresh_seed());
  for (int parts : {1, 2, 7, 66, 132}) {
    check_plan({1}, parts, 5);
    check_plan({0}, parts, 5);
    check_plan({4096}, parts, 5);
    check_plan({32768}, parts, 5);
    check_plan({131072}, parts, 0);
    check_plan({1, 20, 63, 64, 65, 140, 4096, 0}, parts, 5);
    for (int trial = 0; trial < 20; ++trial) {
      const int n = 1 + int(rng() % 200);
      std::vector<std::int32_t> lens(n);
      for (auto& l : lens) l = int(rng() % 9000);
      check_plan(lens, parts, int(rng() % 8), trial % 3 ? 1 : 1 + int(rng() % 12));
    }
    for (int m : {2, 3, 9, 70}) {
      check_plan({4096}, parts, 5, m);
      check_plan({1, 20, 63, 64, 65, 140, 4096, 0}, parts, 5, m);
    }
  }
}

// The scheduler kernel's closed form (scan + per-part search, mla_plan.h) gives exactly the
// page-by-page reference plan.
TEST(MlaSchedCpu, ClosedFormEqualsPageWalk) {
  std::mt19937_64 rng(test::fresh_seed());
  auto compare = [](const std::vector<std::int32_t>& lens, int parts, int overhead, int min_units = 1) {
    const ref::MlaSchedule want = ref::mla_sched(lens, parts, overhead, min_units);
    const int n = int(lens.size());
    std::vector<int> start(n + 1, 0);
    for (int b = 0; b < n; ++b) start[b + 1] = start[b] + mla::plan_pages(lens[b], 1 << 30) + overhead;
    const int unit = mla::plan_unit(start[n], parts, min_units);
    std::vector<ops::MlaPartPlan> plans(want.parts.size());
    std::vector<std::int32_t> splits(n + 1, 0);
    for (int b = 0; b < n; ++b)
      splits[b + 1] = splits[b] + mla::plan_request_splits(start[b], int(start[b + 1] - start[b] - overhead), overhead, unit);
    for (int k = 0; k < parts; ++k)
      mla::plan_part(k, n, overhead, unit, [&](int b) { return start[b]; }, plans[std::size_t(k)]);
    ASSERT_TRUE(plans == want.parts) << "N=" << n << " P=" << parts << " C=" << overhead << " M=" << min_units;
    ASSERT_EQ(splits, want.num_splits) << "N=" << n << " P=" << parts << " C=" << overhead << " M=" << min_units;
  };
  for (int parts : {1, 2, 5, 33, 66, 132}) {
    compare({1}, parts, 5);
    compare({0}, parts, 5);
    compare({4096}, parts, 5);
    compare({131072}, parts, 5);
    compare({131072}, parts, 0);
    compare(std::vector<std::int32_t>(128, 8192), parts, 5);
    compare({1, 20, 63, 64, 65, 140, 4096, 0}, parts, 5);
    for (int trial = 0; trial < 50; ++trial) {
      const int n = 1 + int(rng() % 300);
      std::vector<std::int32_t> lens(n);
      const int max_len = trial % 2 ? 1000 : 40000;
      for (auto& l : lens) l = int(rng() % max_len);
      compare(lens, parts, int(rng() % 9), trial % 3 ? 1 : 1 + int(rng() % 12));
    }
  }
}

TEST(MlaSchedCpu, SpecExampleAndDeterminism) {
  // docs/mla.md §7: N = 1, len 4K, C = 5, P = 132 -> 64 one-page splits.
  const ref::MlaSchedule s = ref::mla_sched({4096}, 132, 5);
  EXPECT_EQ(s.num_splits[1], 64);
  const ref::MlaSchedule s1 = ref::mla_sched({4096}, 1, 5);
  EXPECT_EQ(s1.num_splits[1], 1);
  EXPECT_TRUE(s.parts == ref::mla_sched({4096}, 132, 5).parts);
  // 128 requests of 8K over 132 parts: every part gets ceil(128 * 133 / 132) = 129 units.
  const ref::MlaSchedule big = ref::mla_sched(std::vector<std::int32_t>(128, 8192), 132, 5);
  EXPECT_LE(big.num_splits[128], 128 + 131);
  // 32K at N = 1: 517 units over 132 parts of 4 (positions 5..516 -> parts 1..129).
  EXPECT_EQ(ref::mla_sched({32768}, 132, 5).num_splits[1], 129);
  // At least M units a part: 4K at M = 3 -> positions 5..68 in parts 1..22, 22 splits; 16
  // requests of 4K (1104 units, U = 9 from P alone) plan as with M = 1 for M <= 9.
  EXPECT_EQ(ref::mla_sched({4096}, 132, 5, 3).num_splits[1], 22);
  const std::vector<std::int32_t> sixteen(16, 4096);
  EXPECT_TRUE(ref::mla_sched(sixteen, 132, 5, 9).parts == ref::mla_sched(sixteen, 132, 5).parts);
  EXPECT_NE(ref::mla_sched(sixteen, 132, 5, 10).num_splits, ref::mla_sched(sixteen, 132, 5).num_splits);
}

TEST(MlaRopeCpu, YarnThetaMatchesSpec) {
  const MlaRope r = mla_rope_deepseek_v3();
  for (int i = 0; i < 32; ++i) {
    const double theta = std::pow(10000.0, -2.0 * i / 64);
    const double gamma = std::clamp((i - 10) / 13.0, 0.0, 1.0);
    EXPECT_NEAR(ref::mla_rope_theta(r, i), theta * ((1 - gamma) + gamma / 40), 1e-15) << i;
  }
  EXPECT_DOUBLE_EQ(ref::mla_rope_theta(r, 3), std::pow(10000.0, -6.0 / 64));
  EXPECT_DOUBLE_EQ(ref::mla_rope_theta(r, 30), std::pow(10000.0, -60.0 / 64) / 40);
}

TEST(MlaRopeCpu, ScoresDependOnRelativePositionOnlyAndNopeIsIdentity) {
  std::mt19937_64 rng(test::fresh_seed());
  std::normal_distribution<double> dist;
  double q[64], k[64], qr[64], kr[64];
  for (int i = 0; i < 64; ++i) q[i] = dist(rng), k[i] = dist(rng);
  const MlaRope r = mla_rope_deepseek_v3();
  auto score = [&](int pq, int pk) {
    ref::mla_rope_apply(r, pq, q, qr);
    ref::mla_rope_apply(r, pk, k, kr);
    double s = 0;
    for (int i = 0; i < 64; ++i) s += qr[i] * kr[i];
    return s;
  };
  EXPECT_NEAR(score(1000, 990), score(50000, 49990), 1e-8);
  EXPECT_GT(std::abs(score(1000, 990) - score(1000, 900)), 1e-6);  // rotation is real
  ref::mla_rope_apply(mla_rope_none(), 12345, q, qr);
  for (int i = 0; i < 64; ++i) EXPECT_EQ(qr[i], q[i]);
}

// The absorbed path (q576 -> MQA over latent rows -> W_UV) equals as-trained MHA in exact arithmetic.
void absorbed_equals_model(const MlaRope& rope, double scale) {
  std::mt19937_64 rng(test::fresh_seed());
  const int heads = 8, len = 150, pos = len - 1;
  std::vector<float> q = test::random_normal(std::size_t(heads) * kMlaQHeadDim, rng);
  std::vector<float> rows = test::random_normal(std::size_t(len) * kMlaRowDim, rng, 0.f, 0.3f);
  std::vector<float> kv_b = test::random_normal(std::size_t(heads) * kMlaKvbRowsPerHead * kMlaLatentDim, rng, 0.f, 0.05f);
  const std::vector<double> q576 = ref::mla_q_absorb(q.data(), kv_b.data(), heads, pos, rope);
  // mla_attention_absorbed takes fp32 q; the rounding (~6e-8) is far below the bound.
  std::vector<float> q576f(q576.begin(), q576.end());
  std::vector<double> o_lat(std::size_t(heads) * kMlaLatentDim), lse(heads), absorbed(std::size_t(heads) * kMlaVHeadDim),
      model(std::size_t(heads) * kMlaVHeadDim);
  ref::mla_attention_absorbed(q576f.data(), rows.data(), len, heads, scale, o_lat.data(), lse.data());
  ref::mla_v_up(o_lat.data(), kv_b.data(), heads, absorbed.data());
  ref::mla_attention_model(q.data(), pos, rows.data(), len, kv_b.data(), heads, scale, rope, model.data(), 2);
  EXPECT_LT(test::rel_l2(absorbed, model), 1e-5);
}

TEST(MlaRefCpu, AbsorbedEqualsAsTrainedKimiNope) { absorbed_equals_model(mla_rope_none(), kMlaScaleKimi); }
TEST(MlaRefCpu, AbsorbedEqualsAsTrainedDeepSeekYarn) { absorbed_equals_model(mla_rope_deepseek_v3(), kMlaScaleDeepSeekV3); }

TEST(MlaRefCpu, ScalesMatchSpec) {
  EXPECT_NEAR(kMlaScaleKimi, 1.0 / std::sqrt(192.0), 1e-7);
  const double mscale = 0.1 * std::log(40.0) + 1.0;
  EXPECT_NEAR(kMlaScaleDeepSeekV3, mscale * mscale / std::sqrt(192.0), 1e-6);
}

// ---- launcher validation: fake, never dereferenced device addresses -----------------------------
template <class T>
T* fake(std::uintptr_t addr) { return reinterpret_cast<T*>(addr); }

MlaAttentionParams good_attention() {
  MlaAttentionParams p;
  p.q576 = fake<const __nv_bfloat16>(0x100000);
  p.cache.pages = fake<__nv_bfloat16>(0x10000000);
  p.cache.num_pages = 16;
  p.cache.block_table = fake<const std::int32_t>(0x200000);
  p.cache.block_table_stride = 8;
  p.cache.max_pages_per_seq = 8;
  p.seq_lens = fake<const std::int32_t>(0x210000);
  p.part_plans = fake<const ops::MlaPartPlan>(0x220000);
  p.num_splits = fake<const std::int32_t>(0x230000);
  p.error_flag = fake<std::int32_t>(0x240000);
  p.batch = 2;
  p.num_heads = 32;
  p.num_parts = 4;
  p.o_lat = fake<float>(0x1000000);
  p.lse = fake<float>(0x2000000);
  p.partial_o = fake<float>(0x3000000);
  p.partial_lse = fake<float>(0x4000000);
  return p;
}

TEST(MlaValidationCpu, AttentionRejectsBadInputBeforeLaunch) {
  EXPECT_TRUE(mla_validate(good_attention()).ok()) << mla_validate(good_attention()).to_string();
  auto expect = [](MlaAttentionParams p, StatusCode code) {
    const Status st = mla_attention(p, nullptr);
    EXPECT_EQ(st.code(), code) << st.to_string();
    EXPECT_FALSE(st.message().empty());
  };
  { auto p = good_attention(); p.cache.block_table = nullptr; expect(p, StatusCode::kNullPointer); }
  { auto p = good_attention(); p.num_heads = 12; expect(p, StatusCode::kUnsupported); }
  { auto p = good_attention(); p.num_heads = 256; expect(p, StatusCode::kUnsupported); }
  { auto p = good_attention(); p.q576 = fake<const __nv_bfloat16>(0x100008); expect(p, StatusCode::kMisaligned); }
  { auto p = good_attention(); p.o_lat = fake<float>(0x1000004); expect(p, StatusCode::kMisaligned); }
  { auto p = good_attention(); p.cache.max_pages_per_seq = 9; expect(p, StatusCode::kOutOfRange); }
  { auto p = good_attention(); p.cache.num_pages = 0; expect(p, StatusCode::kInvalidArgument); }
  { auto p = good_attention(); p.softmax_scale = 0.f; expect(p, StatusCode::kInvalidArgument); }
  { auto p = good_attention(); p.batch = 0; expect(p, StatusCode::kOutOfRange); }
  { auto p = good_attention(); p.lse = p.o_lat + 100; expect(p, StatusCode::kOverlap); }
  { auto p = good_attention(); p.partial_o = fake<float>(0x10000000); expect(p, StatusCode::kOverlap); }  // on the cache
  { auto p = good_attention(); p.counters = fake<std::int32_t>(0x250002); expect(p, StatusCode::kMisaligned); }
  { auto p = good_attention(); p.counters = fake<std::int32_t>(0x2000004); expect(p, StatusCode::kOverlap); }  // on lse
  { auto p = good_attention(); p.counters = fake<std::int32_t>(0x230004); expect(p, StatusCode::kOverlap); }  // on num_splits
  { auto p = good_attention(); p.counters = fake<std::int32_t>(0x250000); EXPECT_TRUE(mla_validate(p).ok()); }
}

TEST(MlaValidationCpu, OtherLaunchersRejectBadInput) {
  MlaSchedParams s;
  s.seq_lens = fake<const std::int32_t>(0x1000);
  s.cache.block_table = fake<const std::int32_t>(0x2000);
  s.cache.num_pages = 4;
  s.cache.block_table_stride = 4;
  s.cache.max_pages_per_seq = 4;
  s.batch = 1;
  s.num_parts = 1;
  s.part_plans = fake<ops::MlaPartPlan>(0x3000);
  s.num_splits = fake<std::int32_t>(0x4000);
  s.error_flag = fake<std::int32_t>(0x5000);
  EXPECT_TRUE(mla_validate(s).ok()) << mla_validate(s).to_string();
  { auto p = s; p.cache.block_table = nullptr; EXPECT_EQ(mla_sched(p, nullptr).code(), StatusCode::kNullPointer); }
  { auto p = s; p.error_flag = nullptr; EXPECT_EQ(mla_sched(p, nullptr).code(), StatusCode::kNullPointer); }
  { auto p = s; p.num_parts = 0; EXPECT_EQ(mla_sched(p, nullptr).code(), StatusCode::kInvalidArgument); }
  { auto p = s; p.min_part_units = 0; EXPECT_EQ(mla_sched(p, nullptr).code(), StatusCode::kInvalidArgument); }
  { auto p = s; p.min_part_units = (1 << 16) + 1; EXPECT_EQ(mla_sched(p, nullptr).code(), StatusCode::kInvalidArgument); }
  { auto p = s; p.cache.max_pages_per_seq = 5; EXPECT_EQ(mla_sched(p, nullptr).code(), StatusCode::kOutOfRange); }

  MlaKvAppendParams a;
  a.kv_a = fake<const float>(0x10000);
  a.norm_weight = fake<const float>(0x20000);
  a.positions = fake<const std::int32_t>(0x30000);
  a.seq_lens = fake<const std::int32_t>(0x40000);
  a.cache = s.cache;
  a.cache.pages = fake<__nv_bfloat16>(0x1000000);
  a.batch = 1;
  a.error_flag = fake<const std::int32_t>(0x50000);
  EXPECT_TRUE(mla_validate(a).ok()) << mla_validate(a).to_string();
  { auto p = a; p.cache.block_table = nullptr; EXPECT_EQ(mla_kv_append(p, nullptr).code(), StatusCode::kNullPointer); }
  { auto p = a; p.cache.pages = fake<__nv_bfloat16>(0x1000002); EXPECT_EQ(mla_kv_append(p, nullptr).code(), StatusCode::kMisaligned); }
  { auto p = a; p.kv_a_stride = 500; EXPECT_EQ(mla_kv_append(p, nullptr).code(), StatusCode::kInvalidArgument); }
  { auto p = a; p.rope.mode = MlaRopeMode(7); EXPECT_EQ(mla_kv_append(p, nullptr).code(), StatusCode::kInvalidArgument); }
  { auto p = a; p.kv_a = fake<const float>(0x1000000 + 4096); EXPECT_EQ(mla_kv_append(p, nullptr).code(), StatusCode::kOverlap); }

  MlaQAbsorbParams q;
  q.q = fake<const float>(0x100000);
  q.kv_b = fake<const __nv_bfloat16>(0x1000000);
  q.positions = fake<const std::int32_t>(0x200000);
  q.q576 = fake<__nv_bfloat16>(0x4000000);
  q.batch = 2;
  q.num_heads = 16;
  q.q_stride = 16 * 192;
  EXPECT_TRUE(mla_validate(q).ok()) << mla_validate(q).to_string();
  { auto p = q; p.num_heads = 24; EXPECT_EQ(mla_q_absorb(p, nullptr).code(), StatusCode::kUnsupported); }
  { auto p = q; p.q_stride = 100; EXPECT_EQ(mla_q_absorb(p, nullptr).code(), StatusCode::kInvalidArgument); }
  { auto p = q; p.q576 = nullptr; EXPECT_EQ(mla_q_absorb(p, nullptr).code(), StatusCode::kNullPointer); }

  MlaVUpParams v;
  v.o_lat = fake<const float>(0x100000);
  v.kv_b = fake<const __nv_bfloat16>(0x1000000);
  v.out = fake<float>(0x4000000);
  v.batch = 1;
  v.num_heads = 128;
  EXPECT_TRUE(mla_validate(v).ok()) << mla_validate(v).to_string();
  { auto p = v; p.num_heads = 4; EXPECT_EQ(mla_v_up(p, nullptr).code(), StatusCode::kUnsupported); }
  { auto p = v; p.out = fake<float>(0x4000008); EXPECT_EQ(mla_v_up(p, nullptr).code(), StatusCode::kMisaligned); }
  { auto p = v; p.out = fake<float>(0x100000 + 64); EXPECT_EQ(mla_v_up(p, nullptr).code(), StatusCode::kOverlap); }
}

}  // namespace
}  // namespace encore
