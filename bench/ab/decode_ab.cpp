// encore_ab, the main job: the graph path against the megakernel on the Kimi-Linear-48B-A3B preset
// (random Q4_K weights of the real shapes, ~28 GB) for batches and contexts, in one run on one GPU:
// per-token latency of each path (medians over interleaved rounds), tokens/s, % of the bandwidth
// floor (pipeline::step_bytes over the read bandwidth measured in the same run) and the speed-up.
// Before timing, each batch runs one step through both paths from the same state and checks that
// the logits agree bit for bit. Writes a table to stdout, JSON, and (through plot_ab.py, when
// python3 with matplotlib is there) a PNG of latency against context, one panel per batch.
//
//   encore_ab [--batches 1,4,16] [--contexts 1024,4096,16384,32768] [--long 131072]
//             [--steps 10] [--rounds 7] [--out DIR] [--trace] [--gemv-core auto|dp4a|int8|f16]
//             [--model kimi|kimi-kda] [--blocks-per-sm 1|2] [--mla-parts P]
//             [--mla-min-units M] [--chain]
// --chain also times, against the megakernel in the same rounds, its chain alone: the same program
// with every body skipped (MegakernelOptions::chain_only), the waits and signals with no bytes.
// kimi-kda is the preset with every MLA layer made a KDA layer. --blocks-per-sm 2 runs the
// megakernel at two blocks per SM (split-KV in its tile shape for half an SM); the batches it
// refuses (from 3: the dense down projection's plan needs more than half an SM) are skipped.
// --mla-parts sets the MLA split plan's parts P for both paths (docs/mla.md §7; default: one per
// SM at up to 32 heads): fewer parts give fewer, longer splits, fewer partials to store and merge.
// --mla-min-units sets the fewest tape units a part takes (ops::MlaSchedParams::min_part_units): the
// same for short steps only.
// Without a CUDA device it says so and exits with status 1.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include <encore/device.h>
#include <encore/graphs/decode_graph.h>
#include <encore/pipeline/megakernel.h>
#include <encore/pipeline/pipeline.h>

#include "bench_util.h"

namespace {

using encore::Status;
using encore::pipeline::DecodeStep;
using encore::pipeline::Megakernel;
using encore::pipeline::Pipeline;

struct Options {
  std::vector<int> batches = {1, 4, 16};
  std::vector<int> contexts = {1024, 4096, 16384, 32768};
  int long_context = 131072;  // batch 1 only
  int steps = 10, rounds = 7;
  std::string out = "out";
  bool trace = false;  // also one traced megakernel step per point: where its time goes
  encore::ops::GemvCore gemv_core = encore::ops::GemvCore::kAuto;  // the Q4_K GEMV stages' core, both paths
  bool kda_for_mla = false;  // --model kimi-kda
  int blocks_per_sm = 1;     // the megakernel's resident blocks per SM
  bool chain = false;        // also time the megakernel's chain alone (bodies skipped)
  int mla_parts = 0;         // the MLA split plan's parts (0: the device's default)
  int mla_min_units = 1;     // the fewest tape units an MLA part takes
};

std::vector<int> parse_list(const char* s) {
  std::vector<int> v;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) v.push_back(std::atoi(item.c_str()));
  return v;
}

bool parse(int argc, char** argv, Options& o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const char* next = i + 1 < argc ? argv[i + 1] : nullptr;
    if (a == "--help" || a == "-h") {
      std::printf("usage: encore_ab [--batches 1,4,16] [--contexts 1024,4096,16384,32768] [--long 131072 (batch 1; 0: none)]\n"
                  "                 [--steps 10] [--rounds 7] [--out DIR] [--trace] [--gemv-core auto|dp4a|int8|f16]\n"
                  "                 [--model kimi|kimi-kda] [--blocks-per-sm 1|2] [--mla-parts P] [--mla-min-units M] [--chain]\n");
      std::exit(0);
    }
    if (a == "--chain") {
      o.chain = true;
      continue;
    }
    if (a == "--trace") {
      o.trace = true;
      continue;
    }
    if (!next) return false;
    if (a == "--batches") o.batches = parse_list(next);
    else if (a == "--contexts") o.contexts = parse_list(next);
    else if (a == "--long") o.long_context = std::atoi(next);
    else if (a == "--steps") o.steps = std::max(1, std::atoi(next));
    else if (a == "--rounds") o.rounds = std::max(1, std::atoi(next));
    else if (a == "--out") o.out = next;
    else if (a == "--gemv-core") {
      const std::string c = next;
      using encore::ops::GemvCore;
      if (c == "auto") o.gemv_core = GemvCore::kAuto;
      else if (c == "dp4a") o.gemv_core = GemvCore::kDp4a;
      else if (c == "int8") o.gemv_core = GemvCore::kMma;
      else if (c == "f16") o.gemv_core = GemvCore::kMmaF16;
      else return false;
    } else if (a == "--model") {
      const std::string m = next;
      if (m == "kimi") o.kda_for_mla = false;
      else if (m == "kimi-kda") o.kda_for_mla = true;
      else return false;
    } else if (a == "--blocks-per-sm") {
      const std::string b = next;
      if (b == "1") o.blocks_per_sm = 1;
      else if (b == "2") o.blocks_per_sm = 2;
      else return false;
    } else if (a == "--mla-parts") {
      o.mla_parts = std::atoi(next);
      if (o.mla_parts < 1) return false;
    } else if (a == "--mla-min-units") {
      o.mla_min_units = std::atoi(next);
      if (o.mla_min_units < 1) return false;
    } else return false;
    ++i;
  }
  return true;
}

void check(const Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "encore_ab: %s: %s\n", what, s.to_string().c_str());
    std::exit(2);
  }
}

// Median over rounds of the per-step time of `steps` back-to-back steps; the two paths alternate
// round by round so drift in clocks or temperature hits both alike.
void time_paths(const DecodeStep& graph, const DecodeStep& mk, const Options& o, cudaStream_t stream, double& graph_s, double& mk_s) {
  cudaEvent_t a, b;
  BENCH_CUDA(cudaEventCreate(&a));
  BENCH_CUDA(cudaEventCreate(&b));
  std::vector<double> t[2];
  const DecodeStep* paths[2] = {&graph, &mk};
  for (int r = -1; r < o.rounds; ++r)  // round -1: warm-up
    for (int p = 0; p < 2; ++p) {
      BENCH_CUDA(cudaEventRecord(a, stream));
      for (int s = 0; s < o.steps; ++s) check(paths[p]->run(stream), paths[p]->path());
      BENCH_CUDA(cudaEventRecord(b, stream));
      BENCH_CUDA(cudaEventSynchronize(b));
      float ms = 0;
      BENCH_CUDA(cudaEventElapsedTime(&ms, a, b));
      if (r >= 0) t[p].push_back(ms * 1e-3 / o.steps);
    }
  for (auto& v : t) std::sort(v.begin(), v.end());
  graph_s = t[0][t[0].size() / 2];
  mk_s = t[1][t[1].size() / 2];
  BENCH_CUDA(cudaEventDestroy(a));
  BENCH_CUDA(cudaEventDestroy(b));
}

// One step through each path from the same state: do the logits agree bit for bit?
bool same_bits(Pipeline& p, const DecodeStep& graph, const DecodeStep& mk, cudaStream_t stream) {
  const std::size_t state = std::size_t(p.state_layout().total_bytes()), logits = std::size_t(p.batch()) * p.config().vocab * 4;
  encore::bench::DeviceMemory saved(state);
  std::vector<char> a(logits), b(logits);
  BENCH_CUDA(cudaMemcpyAsync(saved.as(), p.state(), state, cudaMemcpyDeviceToDevice, stream));
  check(graph.run(stream), "graph");
  BENCH_CUDA(cudaMemcpyAsync(a.data(), p.logits(), logits, cudaMemcpyDeviceToHost, stream));
  BENCH_CUDA(cudaMemcpyAsync(p.state(), saved.as(), state, cudaMemcpyDeviceToDevice, stream));
  check(mk.run(stream), "megakernel");
  BENCH_CUDA(cudaMemcpyAsync(b.data(), p.logits(), logits, cudaMemcpyDeviceToHost, stream));
  BENCH_CUDA(cudaStreamSynchronize(stream));
  return std::memcmp(a.data(), b.data(), logits) == 0;
}

// A traced megakernel step: per instruction class (its name without the layer), the time from its
// producers' last signal to its own last signal, split at its last release: release latency and
// work. Along the step's dependency chain these add up to about the step.
void print_trace(const Megakernel& mk, const std::vector<encore::pipeline::MegakernelInstructionTime>& t) {
  struct Sum {
    double first = 0, release = 0, work = 0;
    int count = 0;
  };
  std::vector<std::pair<std::string, Sum>> classes;
  double step = 0;
  for (std::size_t i = 0; i < t.size(); ++i) {
    if (!t[i].blocks) continue;
    const auto& info = mk.program()[i];
    double dep_end = 0;
    for (const auto* list : {&info.prologue_producers, &info.producers})
      for (int j : *list) dep_end = std::max(dep_end, t[j].end);
    std::string name = info.name;
    if (name.rfind("blk.", 0) == 0) name = name.substr(name.find('.', 4) + 1);
    auto it = std::find_if(classes.begin(), classes.end(), [&](const auto& c) { return c.first == name; });
    if (it == classes.end()) it = classes.insert(classes.end(), {name, Sum{}});
    it->second.first += std::max(0.0, t[i].first_ready - dep_end);
    it->second.release += std::max(0.0, t[i].last_ready - dep_end);
    it->second.work += std::max(0.0, t[i].end - std::max(dep_end, t[i].last_ready));
    it->second.count++;
    step = std::max(step, t[i].end);
  }
  std::printf("  traced step %.1f us; per class: instructions, then us summed over them: producers' last signal -> first\n"
              "  release, -> last release, last release -> last signal\n", step);
  for (const auto& [name, s] : classes)
    std::printf("    %-16s %3d  %8.1f  %8.1f  %8.1f\n", name.c_str(), s.count, s.first, s.release, s.work);
}

// The traced step, one line per instruction: its name, its times (us from the first block's start)
// and its producers, for reading the dependency chain instruction by instruction.
void write_trace_csv(const Megakernel& mk, const std::vector<encore::pipeline::MegakernelInstructionTime>& t, const std::string& path) {
  if (std::system(("mkdir -p \"$(dirname '" + path + "')\"").c_str()) != 0) return;
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (!f) return;
  std::fprintf(f, "index,name,tiles,lanes,blocks,first_block,start,first_ready,last_ready,end,producers\n");
  for (std::size_t i = 0; i < t.size(); ++i) {
    const auto& info = mk.program()[i];
    std::string producers;
    for (const auto* list : {&info.prologue_producers, &info.producers})
      for (int j : *list) producers += (producers.empty() ? "" : " ") + std::to_string(j);
    std::fprintf(f, "%zu,%s,%d,%d,%d,%d,%.3f,%.3f,%.3f,%.3f,%s\n", i, info.name.c_str(), info.tiles, info.lanes, t[i].blocks,
                 info.first_block, t[i].start, t[i].first_ready, t[i].last_ready, t[i].end, producers.c_str());
  }
  std::fclose(f);
  std::FILE* g = std::fopen((path.substr(0, path.size() - 4) + "_blocks.csv").c_str(), "w");
  if (!g) return;
  std::fprintf(g, "index,block,start,ready,end\n");
  for (std::size_t i = 0; i < t.size(); ++i)
    for (const auto& b : t[i].per_block) std::fprintf(g, "%zu,%d,%.3f,%.3f,%.3f\n", i, b.block, b.start, b.ready, b.end);
  std::fclose(g);
  // The bodies' marks (expert stream items, GEMV tiles): bench/ab/item_times.py reads them.
  std::FILE* h = std::fopen((path.substr(0, path.size() - 4) + "_marks.csv").c_str(), "w");
  if (!h) return;
  static const char* const kMarks[] = {"stream_ready", "item_begin", "item_weights", "item_computed", "item_end", "combine", "list_built", "ring_started"};
  static_assert(std::size(kMarks) == std::size_t(encore::pipeline::kMegakernelMarkKinds), "a name per mark");
  std::fprintf(h, "index,block,mark,item,us,value\n");
  for (std::size_t i = 0; i < t.size(); ++i)
    for (const auto& b : t[i].per_block)
      for (const auto& m : b.marks) std::fprintf(h, "%zu,%d,%s,%d,%.3f,%u\n", i, b.block, kMarks[int(m.mark)], m.item, m.us, m.value);
  std::fclose(h);
}

struct Row {
  int batch, context;
  double graph_us, mk_us, floor_us, mb;
  bool identical;
};

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!parse(argc, argv, o)) {
    std::fprintf(stderr, "encore_ab: bad arguments (--help lists them)\n");
    return 2;
  }
  std::string why;
  if (!encore::cuda_device_available(&why)) {
    std::fprintf(stderr, "encore_ab: %s; the A/B needs an NVIDIA GPU (built for sm_90a: H100/H200) with ~40 GB free.\n", why.c_str());
    return 1;
  }
  const auto& f = encore::bench::device_facts();
  std::printf("device %s: %d SMs, measured read %.0f GB/s\n", f.name.c_str(), f.sms, f.read_bw_bytes_per_s * 1e-9);
  const encore::pipeline::ModelConfig kimi = encore::pipeline::ModelConfig::kimi_linear_48b();
  const encore::pipeline::ModelConfig config = o.kda_for_mla ? kimi.with_kda_for_mla() : kimi;
  cudaStream_t stream;
  BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  std::vector<Row> rows;
  for (int batch : o.batches) {
    std::vector<int> contexts = o.contexts;
    if (batch == 1 && o.long_context > 0) contexts.push_back(o.long_context);
    const int max_context = *std::max_element(contexts.begin(), contexts.end());
    encore::pipeline::BufferOptions bo;
    bo.max_batch = batch, bo.max_slots = batch;
    bo.gemv_core = o.gemv_core;
    bo.mla_num_parts = o.mla_parts;
    bo.mla_min_part_units = o.mla_min_units;
    bo.max_pages_per_seq = (max_context + 63) / 64, bo.max_pages = batch * bo.max_pages_per_seq;
    std::unique_ptr<Pipeline> p;
    check(Pipeline::create(config, bo, p), "Pipeline::create");
    std::printf("batch %d: filling %.1f GB of weights ...\n", batch, p->weight_layout().total_bytes() * 1e-9);
    std::fflush(stdout);
    check(p->fill_random_weights(0x5EED, stream), "fill_random_weights");
    check(p->reset_state(stream), "reset_state");
    BENCH_CUDA(cudaStreamSynchronize(stream));
    encore::graphs::DecodeGraph graph;
    check(encore::graphs::DecodeGraph::capture(*p, stream, graph), "DecodeGraph::capture");
    Megakernel mk, traced;
    encore::pipeline::MegakernelOptions mk_options;
    mk_options.blocks_per_sm = o.blocks_per_sm;
    if (Status s = Megakernel::build(*p, mk, mk_options); !s.ok() && o.blocks_per_sm > 1) {
      // Half an SM's shared memory refuses some batches (docs/megakernel.md §3): skip them.
      std::printf("batch %d: skipped at %d blocks per SM: %s\n", batch, o.blocks_per_sm, s.to_string().c_str());
      continue;
    } else {
      check(s, "Megakernel::build");
    }
    encore::pipeline::MegakernelOptions trace_options = mk_options;
    trace_options.trace = true;
    if (o.trace) check(Megakernel::build(*p, traced, trace_options), "Megakernel::build (trace)");
    Megakernel chain;
    encore::pipeline::MegakernelOptions chain_options = mk_options;
    chain_options.chain_only = true;
    if (o.chain) check(Megakernel::build(*p, chain, chain_options), "Megakernel::build (chain alone)");
    std::printf("batch %d: graph of %zu nodes, megakernel of %zu instructions on %d blocks, %zu B shared memory\n", batch,
                graph.num_nodes(), mk.program().size(), mk.grid(), mk.smem_bytes());
    for (int context : contexts) {
      check(p->set_step(encore::bench::decode_inputs(batch, context, bo.max_pages_per_seq, config.vocab)), "set_step");
      const bool identical = same_bits(*p, graph, mk, stream);
      double g = 0, m = 0;
      time_paths(graph, mk, o, stream, g, m);
      check(p->read_errors(stream), "read_errors");
      check(mk.read_status(stream), "megakernel");
      const double bytes = encore::pipeline::step_bytes(config, batch, context).total();
      rows.push_back({batch, context, g * 1e6, m * 1e6, bytes / f.read_bw_bytes_per_s * 1e6, bytes * 1e-6, identical});
      std::printf("batch %2d, context %6d: graph %8.1f us, megakernel %8.1f us (%s)\n", batch, context, g * 1e6, m * 1e6,
                  identical ? "same bits" : "BITS DIFFER");
      if (o.chain) {
        double full = 0, chain_alone = 0;
        time_paths(mk, chain, o, stream, full, chain_alone);
        check(chain.read_status(stream), "megakernel (chain alone)");
        std::printf("  megakernel %.1f us; its chain alone (bodies skipped) %.1f us\n", full * 1e6, chain_alone * 1e6);
      }
      if (o.trace) {
        std::vector<encore::pipeline::MegakernelInstructionTime> t;
        for (int w = 0; w < 3; ++w) check(traced.run(stream), "megakernel (trace)");
        const Status traced_status = traced.trace(stream, t);  // (kOutOfRange: some marks did not fit; the rest are kept)
        if (traced_status.code() == encore::StatusCode::kOutOfRange)
          std::printf("  %s\n", traced_status.to_string().c_str());
        else
          check(traced_status, "trace");
        print_trace(traced, t);
        write_trace_csv(traced, t, o.out + "/trace_b" + std::to_string(batch) + "_c" + std::to_string(context) + ".csv");
      }
      std::fflush(stdout);
    }
  }

  std::printf("\n| batch | context | graph us | megakernel us | graph tok/s | megakernel tok/s | floor us | graph %% of floor | megakernel %% of floor | speed-up | bits |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Row& r : rows)
    std::printf("| %d | %d | %.1f | %.1f | %.0f | %.0f | %.1f | %.1f | %.1f | %.3fx | %s |\n", r.batch, r.context, r.graph_us, r.mk_us,
                r.batch / r.graph_us * 1e6, r.batch / r.mk_us * 1e6, r.floor_us, 100 * r.floor_us / r.graph_us,
                100 * r.floor_us / r.mk_us, r.graph_us / r.mk_us, r.identical ? "same" : "DIFFER");

  const std::string json = o.out + "/ab.json", png = o.out + "/ab.png";
  if (std::system(("mkdir -p '" + o.out + "'").c_str()) != 0) std::fprintf(stderr, "encore_ab: cannot create %s\n", o.out.c_str());
  if (FILE* j = std::fopen(json.c_str(), "w")) {
    std::fprintf(j, "{\n  \"device\": \"%s\",\n  \"read_GBps\": %.1f,\n  \"model\": \"%s\",\n  \"megakernel_blocks_per_sm\": %d,\n  \"mla_parts\": %d,\n  \"mla_min_units\": %d,\n  \"rows\": [\n",
                 f.name.c_str(), f.read_bw_bytes_per_s * 1e-9, config.name.c_str(), o.blocks_per_sm, o.mla_parts, o.mla_min_units);
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      std::fprintf(j, "    {\"batch\": %d, \"context\": %d, \"graph_us\": %.2f, \"megakernel_us\": %.2f, \"floor_us\": %.2f, "
                      "\"step_MB\": %.1f, \"same_bits\": %s}%s\n",
                   r.batch, r.context, r.graph_us, r.mk_us, r.floor_us, r.mb, r.identical ? "true" : "false", i + 1 < rows.size() ? "," : "");
    }
    std::fprintf(j, "  ]\n}\n");
    std::fclose(j);
    std::printf("\nwrote %s\n", json.c_str());
  }
  // The plot: a small matplotlib script beside this binary's sources.
  const std::string script = std::string(ENCORE_SOURCE_DIR) + "/bench/ab/plot_ab.py";
  const int plotted = std::system(("python3 '" + script + "' '" + json + "' '" + png + "'").c_str());
  if (plotted != 0)
    std::printf("no plot: it needs python3 with matplotlib (pip install matplotlib), then: python3 %s %s %s\n", script.c_str(),
                json.c_str(), png.c_str());
  bool all_same = true;
  for (const Row& r : rows) all_same &= r.identical;
  BENCH_CUDA(cudaStreamDestroy(stream));
  return all_same ? 0 : 3;
}
