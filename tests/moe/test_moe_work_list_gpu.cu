// The MoE work list's builders against each other on the GPU: the one-token build (a warp's
// shuffles) gives, word for word, the list the block-scan build gives, over random routings with
// bad, repeated and out-of-range ids and pad rows.
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "moe/moe_work_list.cuh"
#include "test_util.h"

namespace encore::moe {
namespace {

using test::DeviceBuffer;

// Which builder a launch runs: the dispatch (one token: the warp's) or the block scan.
__global__ void build_list_kernel(ExpertsTileParams p, WorkList out, bool scanned) {
  extern __shared__ __align__(16) char smem[];
  PlanSmem& s = *reinterpret_cast<PlanSmem*>(smem);
  if (scanned)
    build_scanned_list(p, out, s, true);
  else
    build_work_list(p, out, s, true);
}

struct Built {
  std::vector<int> num_passes, passes, entry_token, token_entries, error;
  std::vector<float> entry_weight;
};

struct ListCase {
  int batch, top_k, experts, shared, tokens_per_pass;
};

Built build(const ListCase& c, const std::vector<int>& ids, const std::vector<float>& weights, const std::vector<int>& slot_ids,
            bool scanned) {
  const int per_token = c.top_k + c.shared, entries = c.batch * per_token;
  DeviceBuffer<int> d_ids(ids), d_slots(slot_ids), num_passes(1), passes(std::size_t(4) * entries), entry_token(entries),
      token_entries(entries), error(std::vector<int>{0});
  DeviceBuffer<float> d_weights(weights), entry_weight(entries);
  ExpertsTileParams p{};
  p.num_experts = c.experts, p.num_shared = c.shared, p.top_k = c.top_k, p.batch = c.batch, p.tokens_per_pass = c.tokens_per_pass;
  p.ids = d_ids.get(), p.weights = d_weights.get(), p.slot_ids = d_slots.get(), p.error_flag = error.get();
  const WorkList out{num_passes.get(), reinterpret_cast<int4*>(passes.get()), entry_token.get(), entry_weight.get(), token_entries.get()};
  const int smem = int(sizeof(PlanSmem));
  EXPECT_EQ(cudaFuncSetAttribute(build_list_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), cudaSuccess);
  build_list_kernel<<<1, kBlockThreads, smem>>>(p, out, scanned);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return {num_passes.download(), passes.download(), entry_token.download(), token_entries.download(), error.download(),
          entry_weight.download()};
}

TEST(MoeWorkListGpu, EveryBuilderGivesTheScannedList) {
  ENCORE_REQUIRE_GPU();
  const std::uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(seed);
  std::mt19937_64 rng(seed);
  int cases = 0;
  for (const ListCase& c : {ListCase{1, 8, 256, 1, 1}, ListCase{1, 16, 32, 2, 1}}) {
    for (int round = 0; round < 18; ++round, ++cases) {
      SCOPED_TRACE("batch " + std::to_string(c.batch) + ", top-k " + std::to_string(c.top_k) + ", experts " +
                   std::to_string(c.experts) + ", round " + std::to_string(round));
      // Ids mostly valid and distinct per token; some repeated, negative or past the experts; some pad rows.
      std::vector<int> ids(std::size_t(c.batch) * c.top_k), slot_ids(c.batch);
      std::vector<float> weights(ids.size());
      for (int t = 0; t < c.batch; ++t) {
        slot_ids[t] = round % 3 == 2 && rng() % 3 == 0 ? -1 : t;
        for (int k = 0; k < c.top_k; ++k) {
          const std::size_t at = std::size_t(t) * c.top_k + k;
          const unsigned r = unsigned(rng() % 16);
          ids[at] = round % 2 == 1 && r == 0   ? -1
                    : round % 2 == 1 && r == 1 ? c.experts + int(rng() % 3)
                    : round % 2 == 1 && r == 2 && k > 0 ? ids[at - 1]
                                                        : int(rng() % unsigned(c.experts));
          weights[at] = float(rng() % 1000) / 1000.f;
        }
      }
      const Built want = build(c, ids, weights, slot_ids, true), got = build(c, ids, weights, slot_ids, false);
      ASSERT_EQ(got.num_passes, want.num_passes);
      ASSERT_EQ(got.error, want.error);
      const int passes = want.num_passes[0];
      ASSERT_GE(passes, 0);
      for (int q = 0; q < 4 * passes; ++q) ASSERT_EQ(got.passes[q], want.passes[q]) << "pass " << q / 4;
      EXPECT_EQ(got.token_entries, want.token_entries);
      // The entries the passes name (the others are never read).
      for (int q = 0; q < passes; ++q)
        for (int e = want.passes[4 * q + 1]; e < want.passes[4 * q + 1] + want.passes[4 * q + 2]; ++e) {
          ASSERT_EQ(got.entry_token[e], want.entry_token[e]) << "entry " << e;
          ASSERT_EQ(got.entry_weight[e], want.entry_weight[e]) << "entry " << e;
        }
    }
  }
  EXPECT_EQ(cases, 36);  // (pad rows: every third round, a third of the time)
}

}  // namespace
}  // namespace encore::moe
