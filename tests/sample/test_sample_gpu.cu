// GPU tests of greedy decoding: every output of the device op equals the reference's, on rows in
// every state, for batch and vocab sizes across the chunk edges, eagerly and over replays of one
// captured graph.
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

// The problem's arrays on the device (workspace and flags poisoned / cleared).
struct DeviceGreedy {
  test::DeviceBuffer<float> logits;
  test::DeviceBuffer<std::int32_t> token_ids, positions, seq_lens, slot_ids, block_table, tokens, prompt_lens, flags;
  test::DeviceBuffer<char> workspace;
  ops::GreedyParams p;
  explicit DeviceGreedy(const test::GreedyProblem& g)
      : logits(g.logits), token_ids(g.token_ids), positions(g.positions), seq_lens(g.seq_lens), slot_ids(g.slot_ids),
        block_table(g.block_table), tokens(g.tokens), prompt_lens(g.prompt_lens), flags(std::vector<std::int32_t>{0}),
        workspace(ops::greedy_workspace_bytes(g.batch, g.vocab)) {
    p.logits = logits.get(), p.logits_stride = g.stride, p.vocab = g.vocab, p.batch = g.batch;
    p.token_ids = token_ids.get(), p.positions = positions.get(), p.seq_lens = seq_lens.get(), p.slot_ids = slot_ids.get();
    p.block_table = block_table.get(), p.max_pages_per_seq = g.max_pages_per_seq, p.max_pages = g.max_pages;
    p.tokens = tokens.get(), p.prompt_lens = prompt_lens.get(), p.capacity = g.capacity;
    p.workspace = workspace.get(), p.flags = flags.get();
  }
  void expect_equals(const test::GreedyProblem& want, std::int32_t want_flags) const {
    EXPECT_EQ(want.token_ids, token_ids.download());
    EXPECT_EQ(want.positions, positions.download());
    EXPECT_EQ(want.seq_lens, seq_lens.download());
    EXPECT_EQ(want.slot_ids, slot_ids.download());
    EXPECT_EQ(want.tokens, tokens.download());
    EXPECT_EQ(std::vector<std::int32_t>{want_flags}, flags.download());
  }
};

TEST(GreedyGpu, EveryRowMatchesTheReference) {
  ENCORE_REQUIRE_GPU();
  std::mt19937_64 rng(test::fresh_seed());
  const int shapes[][2] = {{1, 1}, {1, 5}, {3, 4096}, {7, 4097}, {16, 163840}, {64, 32000}, {ops::kSampleMaxBatch, 9000}};
  for (const auto& [batch, vocab] : shapes) {
    SCOPED_TRACE(testing::Message() << "batch " << batch << ", vocab " << vocab);
    test::GreedyProblem g = test::make_greedy_problem(batch, vocab, rng);
    DeviceGreedy d(g);
    cudaStream_t stream;
    CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    ENCORE_OK(ops::greedy_next(d.p, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    std::int32_t flags = 0;
    ref::greedy_next(g.host_params(&flags));
    d.expect_equals(g, flags);
    CUDA_OK(cudaStreamDestroy(stream));
  }
}

// One capture, replayed until rows run out of room: the same as the reference applied as often.
TEST(GreedyGpu, ReplaysOfOneCaptureAdvanceLikeTheReference) {
  ENCORE_REQUIRE_GPU();
  std::mt19937_64 rng(test::fresh_seed());
  test::GreedyProblem g = test::make_greedy_problem(20, 50000, rng);
  DeviceGreedy d(g);
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  ENCORE_OK(ops::greedy_next(d.p, stream));
  CUDA_OK(cudaStreamEndCapture(stream, &graph));
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  std::int32_t flags = 0;
  for (int step = 0; step < 70; ++step) {
    CUDA_OK(cudaGraphLaunch(exec, stream));
    ref::greedy_next(g.host_params(&flags));
  }
  CUDA_OK(cudaStreamSynchronize(stream));
  d.expect_equals(g, flags);
  CUDA_OK(cudaGraphExecDestroy(exec));
  CUDA_OK(cudaGraphDestroy(graph));
  CUDA_OK(cudaStreamDestroy(stream));
}

}  // namespace
}  // namespace encore
