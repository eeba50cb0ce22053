// encore_agree_model: a small random kimi-linear model written as a GGUF file (save_gguf), and
// encore's fp64 reference logits for a token sequence run one token per step. bench/agree/run.sh
// runs llama.cpp on the same file and compares (docs/gguf.md §6).
//
//   encore_agree_model OUT.gguf LOGITS.bin STEPS SEED [int8] [routing=FILE] [layers=SPEC]
// int8: the reference with the kernels' int8 activations in the Q4_K products, as the device runs
// them, instead of exact ones. routing=FILE: the MoE layers take llama.cpp's routing of each step
// (llama_logits' dump) instead of their own, so a near-tie decided the other way does not move
// the comparison. layers=SPEC: the Kimi-Linear preset at full width (hidden 2304, 32 heads, 256
// experts, vocab 163840) with the layers SPEC lists, one letter pair each (K / M: KDA / MLA
// attention, d / e: dense / MoE MLP; e.g. KdKeKeMe is the preset's first four; `all`: the whole
// preset, 28 GB), instead of the tiny model.
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <encore/pipeline/gguf_model.h>
#include <encore/pipeline/random_weights.h>
#include <encore/pipeline/weight_layout.h>
#include <encore/ref/pipeline.h>

#include "agree/agree_tokens.h"

using namespace encore;
using namespace encore::pipeline;

// llama_logits' routing dump: (step, layer) -> (ids, weights).
using Routing = std::map<std::pair<int, int>, std::pair<std::vector<int>, std::vector<float>>>;
bool read_routing(const char* path, Routing& out) {
  std::FILE* f = std::fopen(path, "rb");
  if (!f) return false;
  std::int32_t head[3];
  while (std::fread(head, sizeof(std::int32_t), 3, f) == 3) {
    auto& [ids, weights] = out[{head[0], head[1]}];
    ids.resize(std::size_t(head[2]));
    weights.resize(std::size_t(head[2]));
    if (std::fread(ids.data(), sizeof(int), ids.size(), f) != ids.size() ||
        std::fread(weights.data(), sizeof(float), weights.size(), f) != weights.size())
      break;
  }
  std::fclose(f);
  return true;
}

int main(int argc, char** argv) {
  bool int8 = false, bad = argc < 5;
  std::string full_width_layers;
  Routing routing;
  for (int a = 5; a < argc; ++a) {
    const std::string arg = argv[a];
    if (arg == "int8") int8 = true;
    else if (arg.rfind("routing=", 0) == 0) bad |= !read_routing(arg.c_str() + 8, routing);
    else if (arg.rfind("layers=", 0) == 0) full_width_layers = arg.substr(7);
    else bad = true;
  }
  if (bad) {
    std::fprintf(stderr, "usage: encore_agree_model OUT.gguf LOGITS.bin STEPS SEED [int8] [routing=FILE] [layers=SPEC]\n");
    return 2;
  }
  const int steps = std::atoi(argv[3]);
  const std::uint64_t seed = std::strtoull(argv[4], nullptr, 0);
  ModelConfig c = ModelConfig::tiny_kimi_linear();
  if (!full_width_layers.empty()) {
    c = ModelConfig::kimi_linear_48b();
    if (full_width_layers != "all") {
      throw_if_error(ModelConfig::layers_from_spec(full_width_layers, c));
      c.name += "-" + full_width_layers;
    }
  }
  TensorArena layout;
  throw_if_error(build_weight_layout(c, layout));
  std::vector<unsigned char> weights(std::size_t(layout.total_bytes()));
  fill_random_weights_host(layout, weights.data(), seed);
  throw_if_error(save_gguf(argv[1], c, layout, weights.data()));

  BufferOptions o;
  o.max_batch = 1, o.max_slots = 1, o.max_pages = 4, o.max_pages_per_seq = 4, o.mla_num_parts = 132;
  if (steps < 1 || steps > o.max_pages_per_seq * 64) {
    std::fprintf(stderr, "encore_agree_model: STEPS must be in 1..%d\n", o.max_pages_per_seq * 64);
    return 2;
  }
  ref::DecodeRefState state = ref::decode_ref_state(c, o);
  std::FILE* out = std::fopen(argv[2], "wb");
  if (!out) return 1;
  for (int t = 0; t < steps; ++t) {
    StepInputs in;
    in.token_ids = {agree::token(seed, t, c.vocab)};
    in.positions = {t}, in.seq_lens = {t + 1}, in.slot_ids = {0}, in.block_table = {0, 1, 2, 3};
    const ref::RoutingHook replay = [&](int layer, std::vector<int>& ids, std::vector<float>& w) {
      if (const auto it = routing.find({t, layer}); it != routing.end() && it->second.first.size() == ids.size())
        ids = it->second.first, w = it->second.second;
    };
    const std::vector<double> logits =
        ref::decode_step(c, o, layout, weights.data(), in, 1, int8, state, routing.empty() ? ref::RoutingHook{} : replay);
    const std::vector<float> row(logits.begin(), logits.begin() + c.vocab);
    std::fwrite(row.data(), sizeof(float), row.size(), out);
  }
  std::fclose(out);
  std::printf("encore_agree_model: %s, %d steps of fp64-reference logits (vocab %d)\nprompt-ids ", argv[1], steps, c.vocab);
  for (int t = 0; t < steps; ++t) std::printf("%s%d", t ? "," : "", agree::token(seed, t, c.vocab));  // for encore generate
  std::printf("\n");
  return 0;
}
