// Greedy generation on the device (pipeline::Generator): over the graph path and the megakernel
// path, the tokens equal those of a host loop that stages every step itself and takes the argmax
// of the logits it reads back; start() and step() refuse what they cannot run before enqueuing.
#include <cstdint>
#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include <encore/graphs/decode_graph.h>
#include <encore/pipeline/generator.h>
#include <encore/pipeline/megakernel.h>
#include <encore/pipeline/pipeline.h>
#include <encore/ref/sample.h>

#include "test_util.h"

namespace encore::pipeline {
namespace {

class GeneratorTiny : public ::testing::Test {
 protected:
  void SetUp() override {
    ENCORE_REQUIRE_GPU();
    BufferOptions o;
    o.max_batch = 3, o.max_slots = 4, o.max_pages = 10, o.max_pages_per_seq = 4;
    ENCORE_OK(Pipeline::create(ModelConfig::tiny(true), o, p));
    CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    ENCORE_OK(p->fill_random_weights(seed, stream));
    ENCORE_OK(Generator::create(*p, gen));
  }
  void TearDown() override {
    if (stream) EXPECT_EQ(cudaSuccess, cudaStreamDestroy(stream));
  }
  // Host loop: one set_step + enqueue_step per step, the logits read back, the next token taken
  // from the prompt or the host argmax. Row b uses slot b and pages [b * pages, (b + 1) * pages).
  std::vector<std::vector<std::int32_t>> host_generate(const std::vector<std::vector<std::int32_t>>& prompts, int steps, int pages) {
    const int rows = int(prompts.size()), vocab = p->config().vocab, P = p->options().max_pages_per_seq;
    std::vector<std::vector<std::int32_t>> tokens(prompts);
    for (auto& t : tokens) t.resize(1);
    EXPECT_TRUE(p->reset_state(stream).ok());
    std::vector<float> logits(std::size_t(rows) * vocab);
    for (int t = 0; t < steps; ++t) {
      StepInputs in;
      in.block_table.assign(std::size_t(rows) * P, -1);
      for (int b = 0; b < rows; ++b) {
        in.token_ids.push_back(tokens[b][t]), in.positions.push_back(t), in.seq_lens.push_back(t + 1), in.slot_ids.push_back(b);
        for (int i = 0; i < pages; ++i) in.block_table[std::size_t(b) * P + i] = b * pages + i;
      }
      EXPECT_TRUE(p->set_step(in).ok());
      EXPECT_TRUE(p->enqueue_step(stream).ok());
      EXPECT_EQ(cudaSuccess, cudaMemcpyAsync(logits.data(), p->logits(), logits.size() * 4, cudaMemcpyDeviceToHost, stream));
      EXPECT_EQ(cudaSuccess, cudaStreamSynchronize(stream));
      for (int b = 0; b < rows; ++b)
        tokens[b].push_back(t + 1 < int(prompts[b].size()) ? prompts[b][t + 1] : ref::greedy_argmax(logits.data() + b * vocab, vocab));
    }
    return tokens;
  }
  const std::uint64_t seed = test::fresh_seed();
  std::unique_ptr<Pipeline> p;
  std::unique_ptr<Generator> gen;
  cudaStream_t stream = nullptr;
};

TEST_F(GeneratorTiny, BothPathsGenerateTheHostLoopsTokens) {
  SCOPED_TRACE(seed);
  const int vocab = p->config().vocab;
  const std::vector<std::vector<std::int32_t>> prompts = {
      {int(seed % vocab)}, {5, 9 % vocab, 77 % vocab, 3}, {1, 2}};
  const int new_tokens = 70;  // the longest row crosses a cache page
  graphs::DecodeGraph graph;
  graphs::DecodeGraphOptions graph_options;
  graph_options.copy_staged_inputs = false;
  ENCORE_OK(graphs::DecodeGraph::capture(*p, stream, graph, graph_options));
  MegakernelOptions mk_options;
  mk_options.copy_staged_inputs = false;
  Megakernel mk;
  ENCORE_OK(Megakernel::build(*p, mk, mk_options));

  std::vector<std::vector<std::int32_t>> by_path[2];
  const DecodeStep* paths[2] = {&graph, &mk};
  for (int i = 0; i < 2; ++i) {
    SCOPED_TRACE(paths[i]->path());
    ENCORE_OK(gen->start(prompts, new_tokens, stream));
    ASSERT_EQ(4 + new_tokens - 1, gen->steps_to_finish());
    for (int t = 0; t < gen->steps_to_finish(); ++t) ENCORE_OK(gen->step(*paths[i], stream));
    ENCORE_OK(gen->read_tokens(stream, by_path[i]));
    ENCORE_OK(p->read_errors(stream));
  }
  ENCORE_OK(mk.read_status(stream));
  const int pages = (4 + new_tokens + 63) / 64;
  const auto want = host_generate(prompts, gen->steps_to_finish(), pages);
  for (int b = 0; b < 3; ++b) {
    SCOPED_TRACE(b);
    ASSERT_EQ(std::size_t(gen->steps_to_finish() + 1), want[b].size());
    EXPECT_EQ(want[b], by_path[0][b]);
    EXPECT_EQ(want[b], by_path[1][b]);
    EXPECT_GE(by_path[0][b].size(), prompts[b].size() + new_tokens);
  }
}

TEST_F(GeneratorTiny, RefusesWhatItCannotRunBeforeEnqueuing) {
  const int vocab = p->config().vocab;
  EXPECT_EQ(StatusCode::kInvalidArgument, gen->start({{}}, 4, stream).code());
  EXPECT_EQ(StatusCode::kOutOfRange, gen->start({{vocab}}, 4, stream).code());
  EXPECT_EQ(StatusCode::kOutOfRange, gen->start({{1}, {2}, {3}, {4}}, 4, stream).code());       // 4 rows > batch 3
  EXPECT_EQ(StatusCode::kOutOfRange, gen->start({{1}}, gen->capacity(), stream).code());           // no room for the last token
  EXPECT_EQ(StatusCode::kOutOfRange, gen->start({{1}, {2}, {3}}, 4 * 64 - 1, stream).code());      // 3 rows x 4 pages > 10
  EXPECT_EQ(StatusCode::kInvalidArgument, gen->start({{1}}, 0, stream).code());
  graphs::DecodeGraph copying;
  ENCORE_OK(graphs::DecodeGraph::capture(*p, stream, copying));
  EXPECT_EQ(StatusCode::kInvalidArgument, gen->step(copying, stream).code());  // before start
  ENCORE_OK(gen->start({{1}}, 4, stream));
  const Status s = gen->step(copying, stream);
  EXPECT_EQ(StatusCode::kInvalidArgument, s.code());
  EXPECT_NE(std::string::npos, s.message().find("copy_staged_inputs")) << s.message();
  CUDA_OK(cudaStreamSynchronize(stream));
}

}  // namespace
}  // namespace encore::pipeline
