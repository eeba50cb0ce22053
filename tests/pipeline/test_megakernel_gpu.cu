// The megakernel path on the GPU against the graph path: over chained steps with changing tokens,
// positions, lengths and pad rows, each step runs from the same state through both paths and the
// logits, KDA states and MLA caches must agree bit for bit (the tiny models at their maximum batch,
// at batch 1 and at batch 2 (a token tier with expert streams of its own), the same with the
// stress mode's permuted lanes and delayed producers, and the Kimi-Linear preset at batch 1 and 16).
// Also: the launch captured in a CUDA graph, the trace's times and marks, the bounded wait's report
// on a broken program, and build errors reported before anything runs.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <encore/graphs/decode_graph.h>
#include <encore/pipeline/megakernel.h>
#include <encore/pipeline/pipeline.h>

#include "pipeline/graph_launch.h"
#include "test_util.h"

namespace encore::pipeline {
namespace {

using graphs::DecodeGraph;

// Number of 32-bit words that differ between two device buffers (a test-only integer count).
__global__ void count_differences(const std::uint32_t* a, const std::uint32_t* b, std::size_t words, unsigned long long* out) {
  unsigned long long n = 0;
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < words; i += std::size_t(gridDim.x) * blockDim.x)
    n += a[i] != b[i];
  if (n) atomicAdd(out, n);
}

unsigned long long differing_words(const void* a, const void* b, std::size_t bytes) {
  test::DeviceBuffer<unsigned long long> count(1);
  EXPECT_EQ(cudaSuccess, cudaMemset(count.get(), 0, 8));
  count_differences<<<1024, 256>>>(static_cast<const std::uint32_t*>(a), static_cast<const std::uint32_t*>(b), bytes / 4, count.get());
  EXPECT_EQ(cudaSuccess, cudaGetLastError());
  return count.download()[0];
}

// Rows of a step: row b is a sequence (slot b % slots, its own pages) at position start + t, or a
// pad row on the steps where `pad(b, t)` says so.
struct StepPlan {
  int rows, slots, pages_per_seq;
  StepInputs at(int t, const ModelConfig& c) const {
    StepInputs s;
    for (int b = 0; b < rows; ++b) {
      const bool pad = rows > 1 && (b + t) % 3 == 2;
      const int pos = 7 * b + (b % 2 ? 59 : 3) + t;  // some rows cross a page boundary within the steps
      s.token_ids.push_back((131 * t + 977 * b + 5) % c.vocab);
      s.positions.push_back(pad ? 0 : pos);
      s.seq_lens.push_back(pad ? 0 : pos + 1);
      s.slot_ids.push_back(pad ? -1 : b % slots);
      for (int i = 0; i < pages_per_seq; ++i) s.block_table.push_back(b * pages_per_seq + i);
    }
    return s;
  }
};

// Runs `steps` steps; each from the same state through the graph, then through the megakernel.
// Returns false (with failures recorded) at the first step that differs.
void expect_paths_agree(Pipeline& p, const DecodeStep& graph, const DecodeStep& mk, const StepPlan& plan, int steps,
                        cudaStream_t stream) {
  const std::size_t state_bytes = std::size_t(p.state_layout().total_bytes());
  const std::size_t logit_bytes = std::size_t(p.batch()) * p.config().vocab * 4;
  test::DeviceBuffer<char> before(state_bytes), after_graph(state_bytes), logits_graph(logit_bytes);
  float* logits = const_cast<float*>(p.logits());
  ENCORE_OK(p.reset_state(stream));
  for (int t = 0; t < steps; ++t) {
    SCOPED_TRACE("step " + std::to_string(t));
    ENCORE_OK(p.set_step(plan.at(t, p.config())));
    CUDA_OK(cudaMemcpyAsync(before.get(), p.state(), state_bytes, cudaMemcpyDeviceToDevice, stream));
    CUDA_OK(cudaMemsetAsync(logits, 0xFF, logit_bytes, stream));
    ENCORE_OK(graph.run(stream));
    CUDA_OK(cudaMemcpyAsync(after_graph.get(), p.state(), state_bytes, cudaMemcpyDeviceToDevice, stream));
    CUDA_OK(cudaMemcpyAsync(logits_graph.get(), logits, logit_bytes, cudaMemcpyDeviceToDevice, stream));
    CUDA_OK(cudaMemcpyAsync(p.state(), before.get(), state_bytes, cudaMemcpyDeviceToDevice, stream));
    CUDA_OK(cudaMemsetAsync(logits, 0xFF, logit_bytes, stream));
    ENCORE_OK(mk.run(stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    const unsigned long long logit_diff = differing_words(logits, logits_graph.get(), logit_bytes);
    const unsigned long long state_diff = differing_words(p.state(), after_graph.get(), state_bytes);
    ASSERT_EQ(logit_diff, 0u) << "logit words differ between the paths";
    ASSERT_EQ(state_diff, 0u) << "state words (KDA states, MLA caches) differ between the paths";
    if (t == 0) {  // the step did something: the state moved and the logits are numbers
      EXPECT_GT(differing_words(p.state(), before.get(), state_bytes), 0u);
      std::vector<float> row(p.config().vocab);
      CUDA_OK(cudaMemcpy(row.data(), logits, row.size() * 4, cudaMemcpyDeviceToHost));
      for (float v : row) ASSERT_TRUE(std::isfinite(v));
    }
  }
  ENCORE_OK(p.read_errors(stream));
}

// Captures the graph, builds the megakernel with `options` (stress seeded from `seed`) on the
// expected grid, and runs both for ENCORE_MEGAKERNEL_STEPS steps (default `steps`) from the same
// states: every step the same bits. ENCORE_MEGAKERNEL_WAIT_TIMEOUT_MS replaces the bound on a wait:
// under racecheck a producer's tiles can take longer than the default 2 s (bench/gpu_check.sh).
void expect_megakernel_matches_graph(Pipeline& p, MegakernelOptions options, std::uint64_t seed, int grid, int steps,
                                     cudaStream_t stream) {
  DecodeGraph graph;
  ENCORE_OK(DecodeGraph::capture(p, stream, graph));
  options.stress_seed = std::uint32_t(seed) | 1u;
  options.wait_timeout_ms = std::uint32_t(test::env_int("ENCORE_MEGAKERNEL_WAIT_TIMEOUT_MS", options.wait_timeout_ms));
  Megakernel mk;
  ENCORE_OK(Megakernel::build(p, mk, options));
  EXPECT_EQ(mk.grid(), grid);
  expect_paths_agree(p, graph, mk, StepPlan{p.batch(), 4, 4}, int(test::env_int("ENCORE_MEGAKERNEL_STEPS", steps)), stream);
  ENCORE_OK(mk.read_status(stream));
}

struct TinyCase {
  bool rope;
  int batch;
  bool stress;
};

class MegakernelTiny : public ::testing::TestWithParam<TinyCase> {
 protected:
  void SetUp() override {
    ENCORE_REQUIRE_GPU();
    BufferOptions o;
    o.max_batch = 3, o.max_slots = 4, o.max_pages = 16, o.max_pages_per_seq = 4;
    ENCORE_OK(Pipeline::create(ModelConfig::tiny(GetParam().rope), o, p));
    CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    ENCORE_OK(p->fill_random_weights(seed, stream));
    ENCORE_OK(p->set_batch(GetParam().batch));
  }
  void TearDown() override {
    if (stream) EXPECT_EQ(cudaSuccess, cudaStreamDestroy(stream));
  }
  const std::uint64_t seed = test::fresh_seed();
  std::unique_ptr<Pipeline> p;
  cudaStream_t stream = nullptr;
};

TEST_P(MegakernelTiny, MatchesTheGraphBitForBit) {
  SCOPED_TRACE(seed);
  MegakernelOptions options;
  options.stress = GetParam().stress;
  expect_megakernel_matches_graph(*p, options, seed, test::sm_count(), 64, stream);
}

// On 5 SMs (MegakernelOptions::sms) the tiny model's instructions run several rounds of tiles per
// block: still the graph's bits, with and without the stress mode's permuted lanes and delays.
TEST_P(MegakernelTiny, OnFewSmsMatchesTheGraphBitForBit) {
  SCOPED_TRACE(seed);
  MegakernelOptions options;
  options.sms = 5;
  options.stress = GetParam().stress;
  expect_megakernel_matches_graph(*p, options, seed, 5, 16, stream);
}

INSTANTIATE_TEST_SUITE_P(Tiny, MegakernelTiny,
                         ::testing::Values(TinyCase{false, 3, false}, TinyCase{true, 3, false}, TinyCase{false, 1, false},
                                           TinyCase{true, 1, false}, TinyCase{false, 3, true}, TinyCase{true, 3, true},
                                           TinyCase{true, 1, true}, TinyCase{true, 2, false}),
                         [](const auto& info) {
                           return std::string(info.param.rope ? "RopeQLora" : "Nope") + "_B" + std::to_string(info.param.batch) +
                                  (info.param.stress ? "_Stress" : "");
                         });

// Two blocks per SM (MegakernelOptions::blocks_per_sm = 2: twice the lanes, bodies capped at 128
// registers and half the shared memory, split-KV in tiles of 16 heads with one page slot): the tiny
// model, with and without its MLA layers, against the graph bit for bit, also with stress.
struct TwoPerSmCase {
  int batch;
  bool stress;
  bool mla;
};
class MegakernelTwoPerSm : public ::testing::TestWithParam<TwoPerSmCase> {};

TEST_P(MegakernelTwoPerSm, MatchesTheGraphBitForBit) {
  ENCORE_REQUIRE_GPU();
  const ModelConfig c = GetParam().mla ? ModelConfig::tiny(true) : ModelConfig::tiny().with_kda_for_mla();
  BufferOptions o;
  o.max_batch = 3, o.max_slots = 4, o.max_pages = 16, o.max_pages_per_seq = 4;
  std::unique_ptr<Pipeline> p;
  ENCORE_OK(Pipeline::create(c, o, p));
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const std::uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(seed);
  ENCORE_OK(p->fill_random_weights(seed, stream));
  ENCORE_OK(p->set_batch(GetParam().batch));
  MegakernelOptions options;
  options.blocks_per_sm = 2;
  options.stress = GetParam().stress;
  expect_megakernel_matches_graph(*p, options, seed, 2 * test::sm_count(), 64, stream);
  CUDA_OK(cudaStreamDestroy(stream));
}

INSTANTIATE_TEST_SUITE_P(Tiny, MegakernelTwoPerSm,
                         ::testing::Values(TwoPerSmCase{3, false, false}, TwoPerSmCase{1, false, false}, TwoPerSmCase{3, true, false},
                                           TwoPerSmCase{3, false, true}, TwoPerSmCase{1, false, true}, TwoPerSmCase{3, true, true}),
                         [](const auto& info) {
                           return std::string(info.param.mla ? "Mla" : "KdaOnly") + "_B" + std::to_string(info.param.batch) +
                                  (info.param.stress ? "_Stress" : "");
                         });

// Beyond 16 rows (the GEMVs in stages of 32 and 16 rows, the last one partly pad rows): the tiny model
// at 40 rows, every row its own slot and pages; on the default GEMV core and on the int8 one.
TEST(MegakernelTinyWide, MatchesTheGraphBitForBit) {
  ENCORE_REQUIRE_GPU();
  BufferOptions o;
  o.max_batch = 40, o.max_slots = 40, o.max_pages_per_seq = 8, o.max_pages = 40 * 8;
  std::unique_ptr<Pipeline> p;
  ENCORE_OK(Pipeline::create(ModelConfig::tiny(true), o, p));
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const std::uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(seed);
  ENCORE_OK(p->fill_random_weights(seed, stream));
  for (ops::GemvCore core : {ops::GemvCore::kAuto, ops::GemvCore::kMma}) {
    SCOPED_TRACE(int(core));
    ENCORE_OK(p->set_gemv_core(core));
    DecodeGraph graph;
    ENCORE_OK(DecodeGraph::capture(*p, stream, graph));
    Megakernel mk;
    ENCORE_OK(Megakernel::build(*p, mk));
    expect_paths_agree(*p, graph, mk, StepPlan{40, 40, 8}, int(test::env_int("ENCORE_MEGAKERNEL_STEPS", 64)), stream);
    ENCORE_OK(mk.read_status(stream));
  }
  CUDA_OK(cudaStreamDestroy(stream));
}

// The Kimi-Linear preset (random weights of the real shapes, ~28 GB) at batch 1, 16 and 64, and at
// 16 on the int8 GEMV core.
TEST(MegakernelKimi, MatchesTheGraphBitForBit) {
  ENCORE_REQUIRE_GPU();
  BufferOptions o;
  o.max_batch = 64, o.max_slots = 64, o.max_pages_per_seq = 10, o.max_pages = 64 * 10;
  std::unique_ptr<Pipeline> p;
  ENCORE_OK(Pipeline::create(ModelConfig::kimi_linear_48b(), o, p));
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const std::uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(seed);
  ENCORE_OK(p->fill_random_weights(seed, stream));
  struct Point {
    int batch;
    ops::GemvCore core;
  };
  for (const Point& at : {Point{1, ops::GemvCore::kAuto}, Point{16, ops::GemvCore::kAuto}, Point{64, ops::GemvCore::kAuto},
                          Point{16, ops::GemvCore::kMma}}) {
    const int batch = at.batch;
    SCOPED_TRACE(std::to_string(batch) + (at.core == ops::GemvCore::kMma ? " rows, int8 GEMV core" : " rows"));
    ENCORE_OK(p->set_batch(batch));
    ENCORE_OK(p->set_gemv_core(at.core));
    DecodeGraph graph;
    ENCORE_OK(DecodeGraph::capture(*p, stream, graph));
    Megakernel mk;
    ENCORE_OK(Megakernel::build(*p, mk));
    expect_paths_agree(*p, graph, mk, StepPlan{batch, 64, 10}, int(test::env_int("ENCORE_MEGAKERNEL_STEPS", 64)), stream);
    ENCORE_OK(mk.read_status(stream));
  }
  CUDA_OK(cudaStreamDestroy(stream));
}

class MegakernelGpu : public MegakernelTiny {};

// The launch (with the input copy) captured into a CUDA graph gives the direct launch's bits.
TEST_P(MegakernelGpu, RunsInsideACapturedGraph) {
  Megakernel mk;
  ENCORE_OK(Megakernel::build(*p, mk));
  const StepPlan plan{p->batch(), 4, 4};
  const std::size_t n = std::size_t(p->batch()) * p->config().vocab;
  std::vector<float> direct(n);
  ENCORE_OK(p->set_step(plan.at(0, p->config())));
  ENCORE_OK(p->reset_state(stream));
  ENCORE_OK(mk.run(stream));
  CUDA_OK(cudaStreamSynchronize(stream));
  CUDA_OK(cudaMemcpy(direct.data(), p->logits(), n * 4, cudaMemcpyDeviceToHost));

  cudaGraph_t g = nullptr;
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const Status run = mk.run(stream);
  CUDA_OK(cudaStreamEndCapture(stream, &g));
  ENCORE_OK(run);
  cudaGraphExec_t exec = nullptr;
  CUDA_OK(cudaGraphInstantiate(&exec, g, 0));
  const std::vector<float> captured = logits_of_launch(*p, exec, stream, n);
  EXPECT_TRUE(test::bitwise_equal(direct.data(), captured.data(), n * 4));
  CUDA_OK(cudaGraphExecDestroy(exec));
  CUDA_OK(cudaGraphDestroy(g));
  ENCORE_OK(mk.read_status(stream));
}

// The trace: every block's times are ordered, the bodies' marks lie inside the block's run in
// order, the GEMVs mark each of their tiles once, every expert stream block marks its set-up,
// and a traced launch gives the untraced launch's bits.
TEST_P(MegakernelGpu, TraceTimesAndMarksAreOrdered) {
  Megakernel plain, traced;
  ENCORE_OK(Megakernel::build(*p, plain));
  MegakernelOptions o;
  o.trace = true;
  ENCORE_OK(Megakernel::build(*p, traced, o));
  std::vector<MegakernelInstructionTime> t;
  EXPECT_EQ(plain.trace(stream, t).code(), StatusCode::kInvalidArgument);  // not built with options.trace

  const std::size_t n = std::size_t(p->batch()) * p->config().vocab;
  std::vector<float> logits[2];
  const Megakernel* paths[2] = {&plain, &traced};
  for (int k = 0; k < 2; ++k) {
    ENCORE_OK(p->set_step(StepPlan{p->batch(), 4, 4}.at(0, p->config())));
    ENCORE_OK(p->reset_state(stream));
    CUDA_OK(cudaMemsetAsync(const_cast<float*>(p->logits()), 0xFF, n * 4, stream));
    ENCORE_OK(paths[k]->run(stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    logits[k].resize(n);
    CUDA_OK(cudaMemcpy(logits[k].data(), p->logits(), n * 4, cudaMemcpyDeviceToHost));
  }
  EXPECT_TRUE(test::bitwise_equal(logits[0].data(), logits[1].data(), n * 4));

  ENCORE_OK(traced.trace(stream, t));
  ASSERT_EQ(t.size(), traced.program().size());
  int streams = 0, tiled = 0;
  for (std::size_t i = 0; i < t.size(); ++i) {
    SCOPED_TRACE(traced.program()[i].name);
    const MegakernelInstructionTime& m = t[i];
    ASSERT_GT(m.blocks, 0);
    ASSERT_EQ(m.per_block.size(), std::size_t(m.blocks));
    EXPECT_LE(m.start, m.first_ready);
    EXPECT_LE(m.first_ready, m.last_ready);
    EXPECT_LE(m.last_ready, m.end);
    int ends = 0, readies = 0;
    for (const MegakernelBlockTime& b : m.per_block) {
      const int grid = traced.grid(), lane = ((b.block - traced.program()[i].first_block) % grid + grid) % grid;
      EXPECT_LT(lane, traced.program()[i].lanes) << "block " << b.block << " ran a lane the program does not place there";
      EXPECT_LE(b.start, b.ready);
      EXPECT_LE(b.ready, b.end);
      double last = b.start;  // (KDA marks its prologue, before the wait)
      std::vector<int> begun;
      for (const MegakernelMarkTime& k : b.marks) {
        EXPECT_GE(k.us, last) << "marks out of order on block " << b.block;
        EXPECT_LE(k.us, b.end);
        last = k.us;
        if (k.mark == MegakernelMark::kStreamReady) ++readies;
        if (k.mark == MegakernelMark::kItemBegin) begun.push_back(k.item);
        if (k.mark == MegakernelMark::kItemWeights || k.mark == MegakernelMark::kItemComputed || k.mark == MegakernelMark::kItemEnd)
          EXPECT_TRUE(!begun.empty() && begun.back() == k.item) << "an item marked before it began, block " << b.block;
        if (k.mark == MegakernelMark::kItemEnd) ++ends;
      }
    }
    const std::string& name = traced.program()[i].name;
    if (name.ends_with("moe.gate_up") || name.ends_with("moe.shared_gate_up") || name.ends_with("moe.down")) {  // an expert stream: every block set up once
      ++streams;
      EXPECT_EQ(readies, m.blocks);
    } else if (name.ends_with("kda") || (readies == 0 && ends > 0)) {  // KDA, a GEMV: each tile once
      ++tiled;
      EXPECT_EQ(ends, traced.program()[i].tiles);
    }
  }
  EXPECT_GT(streams, 0);
  EXPECT_GT(tiled, 0);
}

// The chain-only probe runs every wait and signal and no body: the states, caches and logits keep
// their bytes, and no wait times out.
TEST_P(MegakernelGpu, ChainAloneWritesNothing) {
  Megakernel chain;
  MegakernelOptions o;
  o.chain_only = true;
  ENCORE_OK(Megakernel::build(*p, chain, o));
  ENCORE_OK(p->set_step(StepPlan{p->batch(), 4, 4}.at(0, p->config())));
  ENCORE_OK(p->reset_state(stream));
  const std::size_t n = std::size_t(p->batch()) * p->config().vocab, state = std::size_t(p->state_layout().total_bytes());
  CUDA_OK(cudaMemsetAsync(const_cast<float*>(p->logits()), 0x5A, n * 4, stream));
  std::vector<char> before(state), after(state);
  CUDA_OK(cudaStreamSynchronize(stream));
  CUDA_OK(cudaMemcpy(before.data(), p->state(), state, cudaMemcpyDeviceToHost));
  for (int s = 0; s < 3; ++s) ENCORE_OK(chain.run(stream));
  ENCORE_OK(chain.read_status(stream));
  CUDA_OK(cudaStreamSynchronize(stream));
  CUDA_OK(cudaMemcpy(after.data(), p->state(), state, cudaMemcpyDeviceToHost));
  EXPECT_EQ(std::memcmp(before.data(), after.data(), state), 0) << "a skipped body wrote the state";
  std::vector<std::uint8_t> logits(n * 4);
  CUDA_OK(cudaMemcpy(logits.data(), p->logits(), n * 4, cudaMemcpyDeviceToHost));
  EXPECT_TRUE(std::all_of(logits.begin(), logits.end(), [](std::uint8_t v) { return v == 0x5A; })) << "a skipped body wrote the logits";
}

// A program with a dependency that can never be met: the bounded wait names it, the launch ends,
// and a correct megakernel built afterwards runs on the same context.
TEST_P(MegakernelGpu, ABrokenDependencyIsReportedNotHung) {
  Megakernel probe;
  ENCORE_OK(Megakernel::build(*p, probe));
  int victim = -1;
  for (std::size_t i = 0; i < probe.program().size() && victim < 0; ++i)
    if (probe.program()[i].name.find("kda") != std::string::npos && !probe.program()[i].producers.empty()) victim = int(i);
  ASSERT_GE(victim, 0);
  MegakernelOptions broken;
  broken.break_dependency_of = victim;
  broken.wait_timeout_ms = 50;
  Megakernel mk;
  ENCORE_OK(Megakernel::build(*p, mk, broken));
  ENCORE_OK(p->set_step(StepPlan{p->batch(), 4, 4}.at(0, p->config())));
  ENCORE_OK(mk.run(stream));
  const Status s = mk.read_status(stream);
  EXPECT_EQ(s.code(), StatusCode::kCudaError);
  EXPECT_NE(s.message().find("instruction " + std::to_string(victim) + " (" + probe.program()[victim].name + ")"), std::string::npos)
      << s.message();
  ENCORE_OK(mk.read_status(stream));  // reported once

  ENCORE_OK(p->reset_state(stream));
  ENCORE_OK(probe.run(stream));
  ENCORE_OK(probe.read_status(stream));
  CUDA_OK(cudaStreamSynchronize(stream));
}

TEST_P(MegakernelGpu, BadOptionsFailBeforeAnythingRuns) {
  Megakernel mk;
  MegakernelOptions o;
  o.break_dependency_of = 1 << 20;
  EXPECT_EQ(Megakernel::build(*p, mk, o).code(), StatusCode::kOutOfRange);
  EXPECT_FALSE(mk.valid());
  EXPECT_EQ(mk.run(stream).code(), StatusCode::kInvalidArgument);
  o.break_dependency_of = 0;  // the embedding has no producer
  EXPECT_EQ(Megakernel::build(*p, mk, o).code(), StatusCode::kInvalidArgument);
  o.break_dependency_of = -1;
  o.blocks_per_sm = 3;  // (what two blocks per SM refuses is CPU-tested: MegakernelLower.TwoBlocksPerSm)
  EXPECT_EQ(Megakernel::build(*p, mk, o).code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(mk.valid());
  o.blocks_per_sm = 1;
  o.sms = -1;
  EXPECT_EQ(Megakernel::build(*p, mk, o).code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(mk.valid());
}

INSTANTIATE_TEST_SUITE_P(Tiny, MegakernelGpu, ::testing::Values(TinyCase{true, 3, false}),
                         [](const auto&) { return std::string("RopeQLora_B3"); });

}  // namespace
}  // namespace encore::pipeline
