// CPU tests of greedy decoding: the reference's rules, and the launcher's argument checks.
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include <encore/ops/sample.h>
#include <encore/ref/sample.h>

#include "sample/greedy_problem.h"
#include "test_util.h"

namespace encore {
namespace {

TEST(GreedyRef, ArgmaxTakesTheLowestOfTiedMaximaAndCountsNanAsMinusInfinity) {
  const std::vector<float> ties = {1.f, 3.f, -2.f, 3.f};
  EXPECT_EQ(1, ref::greedy_argmax(ties.data(), 4));
  const std::vector<float> nan_first = {NAN, -5.f, NAN, -4.f};
  EXPECT_EQ(3, ref::greedy_argmax(nan_first.data(), 4));
  const std::vector<float> no_number = {NAN, -INFINITY, NAN};
  EXPECT_EQ(0, ref::greedy_argmax(no_number.data(), 3));
  const std::vector<float> minus_inf_later = {-INFINITY, NAN, -INFINITY};
  EXPECT_EQ(0, ref::greedy_argmax(minus_inf_later.data(), 3));
}

TEST(GreedyRef, FeedsThePromptThenTheArgmaxAndStopsRowsWithoutRoom) {
  std::mt19937_64 rng(test::fresh_seed());
  test::GreedyProblem g = test::make_greedy_problem(10, 300, rng);
  const test::GreedyProblem before = g;
  std::int32_t flags = 0;
  ASSERT_EQ(ops::kSampleRowOutOfRoom, ref::greedy_next(g.host_params(&flags)));
  EXPECT_EQ(ops::kSampleRowOutOfRoom, flags);
  for (int b = 0; b < g.batch; ++b) {
    SCOPED_TRACE(b);
    const int t = before.positions[b] + 1;
    const std::int32_t* history = g.tokens.data() + std::size_t(b) * g.capacity;
    const auto history_unchanged = [&] {
      for (int i = 0; i < g.capacity; ++i) EXPECT_EQ(before.tokens[std::size_t(b) * g.capacity + i], history[i]) << i;
    };
    switch (b % 5) {
      case 2:  // pad row: untouched
        EXPECT_EQ(before.slot_ids[b], g.slot_ids[b]);
        EXPECT_EQ(before.token_ids[b], g.token_ids[b]);
        EXPECT_EQ(before.positions[b], g.positions[b]);
        history_unchanged();
        break;
      case 3: case 4:  // no room: a pad row now, nothing written to the history
        EXPECT_EQ(-1, g.slot_ids[b]);
        EXPECT_EQ(0, g.seq_lens[b]);
        EXPECT_EQ(before.token_ids[b], g.token_ids[b]);
        EXPECT_EQ(before.positions[b], g.positions[b]);
        history_unchanged();
        break;
      default: {
        const std::int32_t want = b % 5 == 1 ? before.tokens[std::size_t(b) * g.capacity + t]
                                             : ref::greedy_argmax(g.logits.data() + b * g.stride, g.vocab);
        EXPECT_EQ(want, g.token_ids[b]);
        EXPECT_EQ(want, history[t]);
        EXPECT_EQ(t, g.positions[b]);
        EXPECT_EQ(t + 1, g.seq_lens[b]);
        EXPECT_EQ(b, g.slot_ids[b]);
      }
    }
  }
}

// Fake, aligned device addresses: validate never dereferences them.
struct FakeGreedy {
  ops::GreedyParams p;
  FakeGreedy() {
    std::uintptr_t next = 0x100000;
    auto take = [&](std::size_t bytes) {
      const std::uintptr_t at = next;
      next += (bytes + 255) / 256 * 256;
      return reinterpret_cast<void*>(at);
    };
    p.batch = 4, p.vocab = 5000, p.logits_stride = 5004, p.max_pages_per_seq = 2, p.max_pages = 8, p.capacity = 128;
    p.logits = static_cast<const float*>(take(4 * 5004 * 4));
    p.token_ids = static_cast<std::int32_t*>(take(16));
    p.positions = static_cast<std::int32_t*>(take(16));
    p.seq_lens = static_cast<std::int32_t*>(take(16));
    p.slot_ids = static_cast<std::int32_t*>(take(16));
    p.block_table = static_cast<const std::int32_t*>(take(32));
    p.tokens = static_cast<std::int32_t*>(take(4 * 128 * 4));
    p.prompt_lens = static_cast<const std::int32_t*>(take(16));
    p.workspace = take(ops::greedy_workspace_bytes(4, 5000));
    p.flags = static_cast<std::int32_t*>(take(4));
  }
};

TEST(GreedyValidate, AcceptsAGoodCallAndNamesEveryBadArgument) {
  ASSERT_TRUE(ops::validate(FakeGreedy().p).ok()) << ops::validate(FakeGreedy().p).to_string();
  struct Case {
    const char* what;
    void (*edit)(ops::GreedyParams&);
    StatusCode code;
  };
  const Case cases[] = {
      {"batch", [](ops::GreedyParams& p) { p.batch = 0; }, StatusCode::kOutOfRange},
      {"batch", [](ops::GreedyParams& p) { p.batch = ops::kSampleMaxBatch + 1; }, StatusCode::kOutOfRange},
      {"vocab", [](ops::GreedyParams& p) { p.vocab = 0; }, StatusCode::kInvalidArgument},
      {"logits_stride", [](ops::GreedyParams& p) { p.logits_stride = 4999; }, StatusCode::kInvalidArgument},
      {"capacity", [](ops::GreedyParams& p) { p.capacity = 129; }, StatusCode::kOutOfRange},
      {"capacity", [](ops::GreedyParams& p) { p.capacity = 0; }, StatusCode::kOutOfRange},
      {"max_pages", [](ops::GreedyParams& p) { p.max_pages = 0; }, StatusCode::kInvalidArgument},
      {"logits", [](ops::GreedyParams& p) { p.logits = nullptr; }, StatusCode::kNullPointer},
      {"token_ids", [](ops::GreedyParams& p) { p.token_ids = nullptr; }, StatusCode::kNullPointer},
      {"positions", [](ops::GreedyParams& p) { p.positions = nullptr; }, StatusCode::kNullPointer},
      {"seq_lens", [](ops::GreedyParams& p) { p.seq_lens = nullptr; }, StatusCode::kNullPointer},
      {"slot_ids", [](ops::GreedyParams& p) { p.slot_ids = nullptr; }, StatusCode::kNullPointer},
      {"block_table", [](ops::GreedyParams& p) { p.block_table = nullptr; }, StatusCode::kNullPointer},
      {"tokens", [](ops::GreedyParams& p) { p.tokens = nullptr; }, StatusCode::kNullPointer},
      {"prompt_lens", [](ops::GreedyParams& p) { p.prompt_lens = nullptr; }, StatusCode::kNullPointer},
      {"workspace", [](ops::GreedyParams& p) { p.workspace = nullptr; }, StatusCode::kNullPointer},
      {"flags", [](ops::GreedyParams& p) { p.flags = nullptr; }, StatusCode::kNullPointer},
      {"workspace", [](ops::GreedyParams& p) { p.workspace = static_cast<char*>(p.workspace) + 4; }, StatusCode::kMisaligned},
      {"tokens", [](ops::GreedyParams& p) { p.tokens = reinterpret_cast<std::int32_t*>(const_cast<float*>(p.logits) + 8); }, StatusCode::kOverlap},
      {"positions", [](ops::GreedyParams& p) { p.positions = p.token_ids + 2; }, StatusCode::kOverlap},
  };
  for (const Case& c : cases) {
    FakeGreedy f;
    c.edit(f.p);
    const Status s = ops::validate(f.p);
    EXPECT_EQ(c.code, s.code()) << c.what << ": " << s.to_string();
    EXPECT_NE(std::string::npos, s.message().find("greedy_next")) << s.message();
    EXPECT_NE(std::string::npos, s.message().find(c.what)) << s.message();
  }
}

TEST(GreedyValidate, WorkspaceCoversEveryRowsChunks) {
  EXPECT_EQ(0u, ops::greedy_workspace_bytes(0, 10));
  EXPECT_EQ(1, ops::greedy_chunks(ops::kSampleChunk));
  EXPECT_EQ(2, ops::greedy_chunks(ops::kSampleChunk + 1));
  EXPECT_GE(ops::greedy_workspace_bytes(3, 163840), std::size_t(3 * 40 * 8));
}

}  // namespace
}  // namespace encore
