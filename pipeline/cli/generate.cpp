// `encore generate`: a kimi-linear GGUF on the GPU, the prompt fed one token per step, then greedy
// tokens (pipeline::Generator over the graph or the megakernel path).
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include <encore/device.h>
#include <encore/gguf.h>
#include <encore/graphs/decode_graph.h>
#include <encore/pipeline/generator.h>
#include <encore/pipeline/gguf_model.h>
#include <encore/pipeline/megakernel.h>
#include <encore/pipeline/pipeline.h>

#include "cli.h"
#include "common/cuda_check.h"
#include "token_text.h"

namespace encore::cli {
namespace {

int fail(const char* what, const Status& s) {
  std::fprintf(stderr, "encore generate: %s: %s\n", what, s.to_string().c_str());
  return 1;
}

// Owns a stream, two events and a pinned buffer; frees them on every exit path.
struct DeviceResources {
  cudaStream_t stream = nullptr;
  cudaEvent_t begin = nullptr, end = nullptr;
  float* pinned_logits = nullptr;
  ~DeviceResources() {
    if (pinned_logits) cudaFreeHost(pinned_logits);
    if (begin) cudaEventDestroy(begin);
    if (end) cudaEventDestroy(end);
    if (stream) cudaStreamDestroy(stream);
  }
};

}  // namespace

int run_generate(const GenerateOptions& o) {
  gguf::File file;
  if (const Status s = gguf::File::open(o.model_path, file); !s.ok()) return fail("model", s);
  pipeline::ModelConfig config;
  if (const Status s = pipeline::model_config_from_gguf(file, &config); !s.ok()) return fail("model", s);
  for (const std::int32_t id : o.prompt_ids)
    if (id < 0 || id >= config.vocab) {
      std::fprintf(stderr, "encore generate: --prompt-ids: token id %d outside the vocabulary [0, %d)\n", id, config.vocab);
      return 2;
    }
  std::string why;
  if (!cuda_device_available(&why)) {
    std::fprintf(stderr, "encore generate: %s; generation needs a Hopper GPU\n", why.c_str());
    return 1;
  }

  // Room for the prompt and the new tokens in every row: one slot and its own cache pages each.
  const int length = int(o.prompt_ids.size()) + o.steps;
  pipeline::BufferOptions options;
  options.max_batch = o.batch, options.max_slots = o.batch;
  options.max_pages_per_seq = (length + ops::kMlaPageTokens - 1) / ops::kMlaPageTokens;
  options.max_pages = o.batch * options.max_pages_per_seq;
  options.gemv_core = o.gemv_core == "dp4a"  ? ops::GemvCore::kDp4a
                      : o.gemv_core == "int8" ? ops::GemvCore::kMma
                      : o.gemv_core == "f16"  ? ops::GemvCore::kMmaF16
                                              : ops::GemvCore::kAuto;
  std::unique_ptr<pipeline::Pipeline> p;
  if (const Status s = pipeline::Pipeline::create(config, options, p); !s.ok()) return fail("pipeline", s);
  std::vector<pipeline::TensorSource> plan;
  if (const Status s = pipeline::plan_gguf_weights(file, config, p->weight_layout(), &plan); !s.ok()) return fail("model", s);
  DeviceResources r;
  if (cudaStreamCreateWithFlags(&r.stream, cudaStreamNonBlocking) != cudaSuccess || cudaEventCreate(&r.begin) != cudaSuccess ||
      cudaEventCreate(&r.end) != cudaSuccess)
    return fail("cuda", Status(StatusCode::kCudaError, cudaGetErrorString(cudaGetLastError())));
  if (const Status s = pipeline::load_gguf_weights(plan, p->weight_layout(), p->weights(), r.stream); !s.ok()) return fail("load", s);

  graphs::DecodeGraph graph;
  pipeline::Megakernel megakernel;
  const pipeline::DecodeStep* step = nullptr;
  if (o.path == "graph") {
    graphs::DecodeGraphOptions go;
    go.copy_staged_inputs = false;
    if (const Status s = graphs::DecodeGraph::capture(*p, r.stream, graph, go); !s.ok()) return fail("graph", s);
    step = &graph;
  } else {
    pipeline::MegakernelOptions mo;
    mo.copy_staged_inputs = false;
    if (const Status s = pipeline::Megakernel::build(*p, megakernel, mo); !s.ok()) return fail("megakernel", s);
    step = &megakernel;
  }
  std::unique_ptr<pipeline::Generator> gen;
  if (const Status s = pipeline::Generator::create(*p, gen); !s.ok()) return fail("generator", s);
  const std::vector<std::vector<std::int32_t>> prompts(std::size_t(o.batch), o.prompt_ids);
  if (const Status s = gen->start(prompts, o.steps, r.stream); !s.ok()) return fail("start", s);

  std::FILE* logits_file = nullptr;
  const std::size_t logits_count = std::size_t(o.batch) * config.vocab;
  if (!o.logits_out.empty()) {
    logits_file = std::fopen(o.logits_out.c_str(), "wb");
    if (!logits_file || cudaMallocHost(&r.pinned_logits, logits_count * 4) != cudaSuccess) {
      std::fprintf(stderr, "encore generate: --logits-out: cannot write %s\n", o.logits_out.c_str());
      if (logits_file) std::fclose(logits_file);
      return 1;
    }
  }
  // Every step replays back to back; only --logits-out reads each step's logits back.
  cudaEventRecord(r.begin, r.stream);
  Status s;
  for (int t = 0; t < gen->steps_to_finish() && s.ok(); ++t) {
    s = gen->step(*step, r.stream);
    if (s.ok() && logits_file) {
      s = detail::cuda_status(cudaMemcpyAsync(r.pinned_logits, p->logits(), logits_count * 4, cudaMemcpyDeviceToHost, r.stream),
                              "logits copy");
      if (s.ok()) s = detail::cuda_status(cudaStreamSynchronize(r.stream), "step");
      if (s.ok() && std::fwrite(r.pinned_logits, 4, logits_count, logits_file) != logits_count)
        s = Status(StatusCode::kInvalidArgument, "cannot write " + o.logits_out);
    }
  }
  if (logits_file) std::fclose(logits_file);
  if (!s.ok()) return fail("step", s);
  cudaEventRecord(r.end, r.stream);
  std::vector<std::vector<std::int32_t>> tokens;
  if (const Status e = gen->read_tokens(r.stream, tokens); !e.ok()) return fail("read", e);
  if (const Status e = p->read_errors(r.stream); !e.ok()) return fail("step", e);
  if (step == &megakernel)
    if (const Status e = megakernel.read_status(r.stream); !e.ok()) return fail("megakernel", e);
  float ms = 0;
  cudaEventElapsedTime(&ms, r.begin, r.end);

  const Vocabulary vocab(file);
  for (int b = 0; b < o.batch; ++b) {
    std::printf("row %d:", b);
    std::string text;
    for (std::size_t i = o.prompt_ids.size(); i < tokens[b].size(); ++i) {
      const std::string piece = vocab.piece(tokens[b][i]);
      std::printf(" %d", tokens[b][i]);
      if (vocab.size()) std::printf(" '%s'", printable(piece).c_str());
      text += piece;
    }
    std::printf("\n");
    if (vocab.size()) std::printf("text %d: %s\n", b, printable(text).c_str());
  }
  const int steps = gen->steps_to_finish();
  std::printf("%s path, batch %d: %d steps (%zu prompt + %d new tokens per row) in %.2f ms: %.1f us per step, %.0f tokens/s%s\n",
              step->path(), o.batch, steps, o.prompt_ids.size(), o.steps, ms, 1e3 * ms / steps, 1e3 * steps * o.batch / ms,
              logits_file ? " (with a logits read-back per step)" : "");
  return 0;
}

}  // namespace encore::cli
