// One decode step of Kimi-Linear-48B-A3B (random Q4_K weights of the real shapes, docs/model.md),
// B sequences at a 4K context, per path: DecodeGraph replays, the Megakernel, and the stages
// launched eagerly (one stream launch per kernel) to show what the graph saves. The main job's
// graph-vs-megakernel table over batches and contexts is bench/ab/decode_ab.cpp (encore_ab).
// Bytes per step = pipeline::step_bytes (weights read once, experts touched under uniform routing,
// KDA state read + write, MLA cache read); % of the measured read bandwidth. Above 16 rows the
// GEMV stages read their weights once per 32 or 16 rows, so that floor is one this design cannot reach.
#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include <encore/graphs/decode_graph.h>
#include <encore/pipeline/megakernel.h>
#include <encore/pipeline/pipeline.h>

#include "bench_util.h"

namespace encore::bench {
namespace {

using pipeline::Pipeline;

constexpr int kMaxBatch = 64, kContext = 4096, kStepsPerIteration = 8;

// One Kimi-Linear pipeline for every decode benchmark (~28 GB of weights, filled once), and one of
// the preset with its MLA layers made KDA layers (ModelConfig::with_kda_for_mla), which separates
// the megakernel's two blocks per SM from split-KV's tile shape for half an SM; built on first use.
struct DecodeSetup {
  std::unique_ptr<Pipeline> pipe;
  cudaStream_t stream = nullptr;
  Status status;  // why the setup failed (then every decode benchmark skips with it)

  explicit DecodeSetup(const pipeline::ModelConfig& config) : status(init(config)) {}
  Status init(const pipeline::ModelConfig& config) {
    pipeline::BufferOptions o;
    o.max_batch = kMaxBatch, o.max_slots = kMaxBatch;
    o.max_pages_per_seq = kContext / 64, o.max_pages = kMaxBatch * o.max_pages_per_seq;
    ENCORE_RETURN_IF_ERROR(Pipeline::create(config, o, pipe));
    BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    ENCORE_RETURN_IF_ERROR(pipe->fill_random_weights(0x5EED, stream));
    ENCORE_RETURN_IF_ERROR(pipe->reset_state(stream));
    BENCH_CUDA(cudaStreamSynchronize(stream));
    return {};
  }
};
DecodeSetup& setup(bool kda_for_mla = false) {
  if (kda_for_mla) {
    static DecodeSetup kda(pipeline::ModelConfig::kimi_linear_48b().with_kda_for_mla());
    return kda;
  }
  static DecodeSetup s(pipeline::ModelConfig::kimi_linear_48b());
  return s;
}

// False (and the benchmark marked skipped with the reason) on error.
bool ok(benchmark::State& state, const Status& st) {
  if (!st.ok()) state.SkipWithError(st.to_string().c_str());
  return st.ok();
}

pipeline::StepInputs step_inputs(int batch, int vocab) { return decode_inputs(batch, kContext, kContext / 64, vocab); }

enum class Path { kEager, kGraph, kMegakernel };

// What a decode benchmark runs: the path, the GEMV core, the model, the megakernel's residency.
struct DecodeRun {
  Path path;
  ops::GemvCore core = ops::GemvCore::kAuto;
  bool kda_for_mla = false;
  int blocks_per_sm = 1;
};

void BM_Decode(benchmark::State& state, DecodeRun run) {
  const int batch = int(state.range(0));
  const Path path = run.path;
  DecodeSetup& s = setup(run.kda_for_mla);
  if (!ok(state, s.status)) return;
  Pipeline& p = *s.pipe;
  graphs::DecodeGraph graph;
  pipeline::Megakernel mk;
  if (!ok(state, p.set_batch(batch)) || !ok(state, p.set_gemv_core(run.core)) ||
      !ok(state, p.set_step(step_inputs(batch, p.config().vocab))))
    return;
  pipeline::MegakernelOptions mk_options;
  mk_options.blocks_per_sm = run.blocks_per_sm;
  if (path == Path::kGraph && !ok(state, graphs::DecodeGraph::capture(p, s.stream, graph))) return;
  if (path == Path::kMegakernel && !ok(state, pipeline::Megakernel::build(p, mk, mk_options))) return;
  auto step = [&] {
    return path == Path::kGraph ? graph.replay(s.stream) : path == Path::kMegakernel ? mk.run(s.stream) : p.enqueue_step(s.stream);
  };
  for (int i = 0; i < 3; ++i)  // warm-up
    if (!ok(state, step())) return;
  BENCH_CUDA(cudaStreamSynchronize(s.stream));

  cudaEvent_t a, b;
  BENCH_CUDA(cudaEventCreate(&a));
  BENCH_CUDA(cudaEventCreate(&b));
  std::vector<double> per_step_s;
  bool good = true;
  for (auto _ : state) {
    BENCH_CUDA(cudaEventRecord(a, s.stream));
    for (int i = 0; i < kStepsPerIteration && good; ++i) good = ok(state, step());
    BENCH_CUDA(cudaEventRecord(b, s.stream));
    BENCH_CUDA(cudaEventSynchronize(b));
    if (!good) break;
    float ms = 0;
    BENCH_CUDA(cudaEventElapsedTime(&ms, a, b));
    per_step_s.push_back(ms * 1e-3 / kStepsPerIteration);
    state.SetIterationTime(ms * 1e-3);
  }
  BENCH_CUDA(cudaEventDestroy(a));
  BENCH_CUDA(cudaEventDestroy(b));
  if (!good || !ok(state, p.read_errors(s.stream)) || per_step_s.empty()) return;

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
  state.counters["instructions"] = double(mk.valid() ? mk.program().size() : 0);
}

const char* role_name(pipeline::StageRole r) {
  using R = pipeline::StageRole;
  switch (r) {
    case R::kEmbed: return "embed";
    case R::kKdaInProj: return "kda.in_proj";
    case R::kKda: return "kda.op";
    case R::kKdaOutProj: return "kda.o_proj";
    case R::kMlaSched: return "mla.sched";
    case R::kMlaInProj: return "mla.in_proj";
    case R::kMlaQB: return "mla.q_b";
    case R::kMlaQAbsorb: return "mla.q_absorb";
    case R::kMlaKvAppend: return "mla.kv_append";
    case R::kMlaSplitKv: return "mla.splitkv";
    case R::kMlaCombine: return "mla.combine";
    case R::kMlaVUp: return "mla.v_up";
    case R::kMlaOutProj: return "mla.o_proj";
    case R::kDenseGateUp: return "dense.gate_up";
    case R::kDenseDown: return "dense.down";
    case R::kMoeRouter: return "moe.router";
    case R::kMoeExperts: return "moe.experts";
    case R::kLmHead: return "lm_head";
  }
  return "?";
}

// Where a step's time goes: the stages launched eagerly with an event before each, per-stage
// medians over the iterations, summed by role (us per step). Events serialise the stages, so the
// total exceeds the graph's step time by the overlap PDL gives; every stage runs its own launch
// here, the pairs the graph path launches together (run_stages) included.
void BM_DecodeStages(benchmark::State& state, ops::GemvCore core) {
  const int batch = int(state.range(0));
  DecodeSetup& s = setup();
  if (!ok(state, s.status)) return;
  Pipeline& p = *s.pipe;
  if (!ok(state, p.set_batch(batch)) || !ok(state, p.set_gemv_core(core)) || !ok(state, p.set_step(step_inputs(batch, p.config().vocab))) ||
      !ok(state, p.enqueue_step(s.stream)))  // the last one: warm-up
    return;
  const std::vector<pipeline::Stage>& stages = p.stages();
  std::vector<cudaEvent_t> events(stages.size() + 1);
  for (auto& e : events) BENCH_CUDA(cudaEventCreate(&e));
  std::vector<std::vector<double>> stage_us(stages.size());
  bool good = true;
  for (auto _ : state) {
    BENCH_CUDA(cudaEventRecord(events[0], s.stream));
    for (std::size_t i = 0; i < stages.size() && good; ++i) {
      good = ok(state, pipeline::run_stage(stages[i], s.stream));
      BENCH_CUDA(cudaEventRecord(events[i + 1], s.stream));
    }
    BENCH_CUDA(cudaEventSynchronize(events.back()));
    if (!good) break;
    float total = 0;
    for (std::size_t i = 0; i < stages.size(); ++i) {
      float ms = 0;
      BENCH_CUDA(cudaEventElapsedTime(&ms, events[i], events[i + 1]));
      stage_us[i].push_back(ms * 1e3);
      total += ms;
    }
    state.SetIterationTime(total * 1e-3);
  }
  for (auto& e : events) BENCH_CUDA(cudaEventDestroy(e));
  if (!good) return;
  std::map<std::string, double> by_role;
  double sum = 0;
  for (std::size_t i = 0; i < stages.size(); ++i) {
    std::sort(stage_us[i].begin(), stage_us[i].end());
    const double med = stage_us[i][stage_us[i].size() / 2];
    by_role[role_name(stages[i].role)] += med;
    sum += med;
  }
  for (const auto& [role, us] : by_role) state.counters["us." + role] = us;
  state.counters["us_sum"] = sum;
}

using ops::GemvCore;
constexpr auto kMicro = benchmark::kMicrosecond;
BENCHMARK_CAPTURE(BM_DecodeStages, kimi_linear, GemvCore::kAuto)->Name("decode/kimi_linear/stages")->Arg(1)->Arg(16)->Arg(64)
    ->UseManualTime()->Unit(kMicro);
BENCHMARK_CAPTURE(BM_Decode, kimi_linear_graph, DecodeRun{Path::kGraph})->Name("decode/kimi_linear/graph")
    ->Arg(1)->Arg(4)->Arg(16)->Arg(32)->Arg(64)->UseManualTime()->Unit(kMicro);
BENCHMARK_CAPTURE(BM_Decode, kimi_linear_megakernel, DecodeRun{Path::kMegakernel})->Name("decode/kimi_linear/megakernel")
    ->Arg(1)->Arg(4)->Arg(16)->Arg(32)->Arg(64)->UseManualTime()->Unit(kMicro);
BENCHMARK_CAPTURE(BM_Decode, kimi_linear_eager, DecodeRun{Path::kEager})->Name("decode/kimi_linear/eager")->Arg(1)
    ->UseManualTime()->Unit(kMicro);
// The same steps with the int8 tensor-core GEMV core (8 tokens and up; the default takes fp16 there).
BENCHMARK_CAPTURE(BM_DecodeStages, kimi_linear_int8, GemvCore::kMma)->Name("decode/kimi_linear/stages_int8")->Arg(16)
    ->UseManualTime()->Unit(kMicro);
BENCHMARK_CAPTURE(BM_Decode, kimi_linear_graph_int8, DecodeRun{Path::kGraph, GemvCore::kMma})->Name("decode/kimi_linear/graph_int8")
    ->Arg(16)->Arg(32)->Arg(64)->UseManualTime()->Unit(kMicro);
BENCHMARK_CAPTURE(BM_Decode, kimi_linear_megakernel_int8, DecodeRun{Path::kMegakernel, GemvCore::kMma})
    ->Name("decode/kimi_linear/megakernel_int8")->Arg(16)->Arg(32)->Arg(64)->UseManualTime()->Unit(kMicro);
// The megakernel at two blocks per SM (batches 1 and 2: from 3 the dense down projection's plan
// needs more than half an SM), on the preset and on the preset with its MLA layers made KDA layers,
// each beside its graph and one-block megakernel.
BENCHMARK_CAPTURE(BM_Decode, kimi_linear_megakernel_2sm, DecodeRun{Path::kMegakernel, GemvCore::kAuto, false, 2})
    ->Name("decode/kimi_linear/megakernel_2_per_sm")->Arg(1)->Arg(2)->UseManualTime()->Unit(kMicro);
BENCHMARK_CAPTURE(BM_Decode, kimi_kda_graph, DecodeRun{Path::kGraph, GemvCore::kAuto, true})->Name("decode/kimi_kda/graph")
    ->Arg(1)->UseManualTime()->Unit(kMicro);
BENCHMARK_CAPTURE(BM_Decode, kimi_kda_megakernel, DecodeRun{Path::kMegakernel, GemvCore::kAuto, true})
    ->Name("decode/kimi_kda/megakernel")->Arg(1)->UseManualTime()->Unit(kMicro);
BENCHMARK_CAPTURE(BM_Decode, kimi_kda_megakernel_2sm, DecodeRun{Path::kMegakernel, GemvCore::kAuto, true, 2})
    ->Name("decode/kimi_kda/megakernel_2_per_sm")->Arg(1)->UseManualTime()->Unit(kMicro);

}  // namespace
}  // namespace encore::bench
