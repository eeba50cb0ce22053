// The main job: one decode step of Kimi-Linear-48B-A3B (random Q4_K weights of the real shapes,
// model.md) through the graph path: DecodeGraph replays, one per token, B sequences at a 4K
// context. Also the same step launched eagerly (one stream launch per kernel) to show what the
// graph saves. The megakernel path is not written yet.
// Bytes per step = pipeline::step_bytes (weights read once, experts touched under uniform routing,
// KDA state read + write, MLA cache read); % of the measured read bandwidth.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include <benchmark/benchmark.h>

#include <encore/graphs/decode_graph.h>
#include <encore/pipeline/pipeline.h>

#include "bench_util.h"

namespace encore::bench {
namespace {

using pipeline::Pipeline;

constexpr int kMaxBatch = 16, kContext = 4096, kStepsPerIteration = 8;

struct DecodeSetup {
  std::unique_ptr<Pipeline> pipe;
  cudaStream_t stream = nullptr;
  Status status;
};

// One Kimi-Linear pipeline for every decode benchmark (~28 GB of weights, filled once).
DecodeSetup& setup() {
  static DecodeSetup s = [] {
    DecodeSetup d;
    pipeline::BufferOptions o;
    o.max_batch = kMaxBatch, o.max_slots = kMaxBatch;
    o.max_pages_per_seq = kContext / 64, o.max_pages = kMaxBatch * o.max_pages_per_seq;
    d.status = Pipeline::create(pipeline::ModelConfig::kimi_linear_48b(), o, d.pipe);
    if (!d.status.ok()) return d;
    BENCH_CUDA(cudaStreamCreateWithFlags(&d.stream, cudaStreamNonBlocking));
    d.status = d.pipe->fill_random_weights(0x5EED, d.stream);
    if (d.status.ok()) d.status = d.pipe->reset_state(d.stream);
    BENCH_CUDA(cudaStreamSynchronize(d.stream));
    return d;
  }();
  return s;
}

pipeline::StepInputs step_inputs(int batch, int vocab) {
  pipeline::StepInputs in;
  const int pages = kContext / 64;
  for (int b = 0; b < batch; ++b) {
    in.token_ids.push_back((1009 * b + 17) % vocab);
    in.positions.push_back(kContext - 1);
    in.seq_lens.push_back(kContext);
    in.slot_ids.push_back(b);
    for (int i = 0; i < pages; ++i) in.block_table.push_back(b * pages + i);
  }
  return in;
}

void BM_Decode(benchmark::State& state, bool use_graph) {
  const int batch = int(state.range(0));
  DecodeSetup& s = setup();
  auto fail = [&](const Status& st) {
    state.SkipWithError(st.to_string().c_str());
  };
  if (!s.status.ok()) return fail(s.status);
  Pipeline& p = *s.pipe;
  Status st = p.set_batch(batch);
  if (st.ok()) st = p.set_step(step_inputs(batch, p.config().vocab));
  graphs::DecodeGraph graph;
  if (st.ok() && use_graph) st = graphs::DecodeGraph::capture(p, s.stream, graph);
  auto step = [&] { return use_graph ? graph.replay(s.stream) : p.enqueue_step(s.stream); };
  for (int i = 0; i < 3 && st.ok(); ++i) st = step();  // warm-up
  if (!st.ok()) return fail(st);
  BENCH_CUDA(cudaStreamSynchronize(s.stream));

  cudaEvent_t a, b;
  BENCH_CUDA(cudaEventCreate(&a));
  BENCH_CUDA(cudaEventCreate(&b));
  std::vector<double> per_step_s;
  for (auto _ : state) {
    BENCH_CUDA(cudaEventRecord(a, s.stream));
    for (int i = 0; i < kStepsPerIteration; ++i)
      if (!(st = step()).ok()) break;
    BENCH_CUDA(cudaEventRecord(b, s.stream));
    BENCH_CUDA(cudaEventSynchronize(b));
    if (!st.ok()) break;
    float ms = 0;
    BENCH_CUDA(cudaEventElapsedTime(&ms, a, b));
    per_step_s.push_back(ms * 1e-3 / kStepsPerIteration);
    state.SetIterationTime(ms * 1e-3);
  }
  BENCH_CUDA(cudaEventDestroy(a));
  BENCH_CUDA(cudaEventDestroy(b));
  if (st.ok()) st = p.read_errors(s.stream);
  if (!st.ok() || per_step_s.empty()) return fail(st.ok() ? Status(StatusCode::kInvalidArgument, "no iterations") : st);

  std::sort(per_step_s.begin(), per_step_s.end());
  const double med = per_step_s[per_step_s.size() / 2];
  const pipeline::StepBytes bytes = pipeline::step_bytes(p.config(), batch, kContext);
  const DeviceFacts& f = device_facts();
  state.counters["us_median"] = med * 1e6;
  state.counters["tokens/s"] = batch / med;
  state.counters["MB"] = bytes.total() * 1e-6;
  state.counters["GB/s"] = bytes.total() / med * 1e-9;
  state.counters["%read_bw"] = 100.0 * bytes.total() / med / f.read_bw_bytes_per_s;
  state.counters["floor_us"] = bytes.total() / f.read_bw_bytes_per_s * 1e6;
  state.counters["kernels"] = double(graph.valid() ? graph.num_nodes() - 1 : 0);  // minus the input copy
}

BENCHMARK_CAPTURE(BM_Decode, kimi_linear_graph, true)->Name("decode/kimi_linear/graph")->Arg(1)->Arg(4)->Arg(16)
    ->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_Decode, kimi_linear_eager, false)->Name("decode/kimi_linear/eager")->Arg(1)
    ->UseManualTime()->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace encore::bench
