// `encore info`: what a GGUF file holds and whether encore runs it.
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include <encore/gguf.h>
#include <encore/pipeline/gguf_model.h>
#include <encore/pipeline/model_config.h>
#include <encore/pipeline/weight_layout.h>

#include "cli.h"
#include "token_text.h"

namespace encore::cli {
namespace {

std::string layer_kinds(const pipeline::ModelConfig& c) {
  std::string s;
  for (int l = 0; l < c.layers(); ++l) {
    s += c.attention[l] == pipeline::Attention::kKda ? 'K' : 'M';
    s += c.mlp[l] == pipeline::Mlp::kMoe ? 'e' : 'd';
    s += l + 1 < c.layers() ? " " : "";
  }
  return s;
}

}  // namespace

int run_info(const std::string& model_path) {
  gguf::File file;
  if (const Status s = gguf::File::open(model_path, file); !s.ok()) {
    std::fprintf(stderr, "encore info: %s\n", s.to_string().c_str());
    return 1;
  }
  std::string arch;
  (void)file.get("general.architecture", &arch);
  std::printf("file          %s (GGUF v%u, %.2f GB)\n", model_path.c_str(), file.version(), double(file.size()) / 1e9);
  std::printf("architecture  %s\n", arch.empty() ? "(none)" : arch.c_str());
  std::map<std::string, std::pair<int, double>> by_type;
  for (const gguf::TensorInfo& t : file.tensors()) {
    auto& [count, bytes] = by_type[gguf::to_string(t.type)];
    ++count, bytes += double(t.bytes);
  }
  std::printf("tensors       %zu:", file.tensors().size());
  for (const auto& [type, cb] : by_type) std::printf(" %d %s (%.3f GB)", cb.first, type.c_str(), cb.second / 1e9);
  std::printf("\n");
  const Vocabulary vocab(file);
  std::printf("tokenizer     %s, %llu tokens\n", vocab.model().empty() ? "(none)" : vocab.model().c_str(),
              static_cast<unsigned long long>(vocab.size()));

  pipeline::ModelConfig c;
  if (const Status s = pipeline::model_config_from_gguf(file, &c); !s.ok()) {
    std::printf("refused       %s\n", s.to_string().c_str());
    return 1;
  }
  std::printf("model         %d layers [%s] (K/M: KDA/MLA attention, e/d: MoE/dense MLP)\n", c.layers(), layer_kinds(c).c_str());
  std::printf("              hidden %d, vocab %d, KDA %d heads x %d, MLA %d heads (kv rank %d), %d experts top-%d of width %d "
              "(+%d shared), dense width %d\n",
              c.hidden, c.vocab, c.kda.heads, c.kda.head_dim, c.mla.heads, c.mla.kv_lora_rank, c.moe.experts, c.moe.top_k,
              c.moe.expert_width, c.moe.shared_experts, c.dense_width);
  pipeline::TensorArena weights;
  std::vector<pipeline::TensorSource> plan;
  std::vector<Status> refusals;
  Status s = pipeline::build_weight_layout(c, weights);
  if (s.ok()) s = pipeline::plan_gguf_weights(file, c, weights, &plan, &refusals);
  if (!s.ok()) {
    if (refusals.empty()) refusals.push_back(s);
    // One line per tensor, without the file's name; the advice that repeats, once at the end.
    const std::string advice = std::string(" (") + pipeline::kQ4kFileAdvice + ")";
    bool advised = false;
    std::printf("refused       %zu tensor(s):\n", refusals.size());
    for (const Status& r : refusals) {
      std::string line = r.message();
      if (line.rfind(model_path + ": ", 0) == 0) line.erase(0, model_path.size() + 2);
      if (const std::size_t at = line.find(advice); at != std::string::npos) line.erase(at, advice.size()), advised = true;
      std::printf("              %s\n", line.c_str());
    }
    if (advised) std::printf("              (%s)\n", pipeline::kQ4kFileAdvice);
    return 1;
  }
  std::map<std::string, int> conversions;
  for (const pipeline::TensorSource& src : plan) ++conversions[pipeline::to_string(src.conversion)];
  std::printf("encore        runs it: %zu weights, %.3f GB in encore's arena;", plan.size(), double(weights.total_bytes()) / 1e9);
  for (const auto& [what, n] : conversions) std::printf(" %d %s", n, what.c_str());
  const pipeline::StepBytes step = pipeline::step_bytes(c, 1, 4096);
  std::printf("\n              one decode step at batch 1, 4K context reads %.1f MB\n", step.total() / 1e6);
  return 0;
}

}  // namespace encore::cli
