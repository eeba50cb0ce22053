// llama.cpp's side of the agreement run (built by bench/agree/run.sh against a llama.cpp checkout
// in peers/, never part of encore's build): the model on the CPU, one token per step, logits out.
//
//   llama_logits MODEL.gguf LOGITS.bin STEPS SEED [routing=FILE] [kv=f32]
// routing=FILE: llama.cpp's routing of every step and MoE layer (int32 step, layer, k, then k
// int32 expert ids and k float weights), for encore's reference to replay. kv=f32: the attention
// cache in fp32 instead of llama.cpp's default f16 (with widen.py's F32 weights, everything fp32).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "agree_tokens.h"
#include "ggml.h"
#include "llama.h"

namespace {

struct RoutingDump {
  std::FILE* out = nullptr;
  int step = 0;
  std::vector<std::int32_t> ids;  // the layer's top-k, until its weights arrive
};

// llama.cpp names a layer's routing tensors ffn_moe_topk-<layer> and ffn_moe_weights_scaled-<layer>.
bool on_tensor(ggml_tensor* t, bool ask, void* user) {
  auto& d = *static_cast<RoutingDump*>(user);
  const std::string name = t->name;
  const bool ids = name.rfind("ffn_moe_topk-", 0) == 0, weights = name.rfind("ffn_moe_weights_scaled-", 0) == 0;
  if (ask) return ids || weights;
  if (ids) d.ids.assign(static_cast<const std::int32_t*>(t->data), static_cast<const std::int32_t*>(t->data) + ggml_nelements(t));
  if (weights) {
    const std::int32_t head[3] = {d.step, std::atoi(name.c_str() + name.rfind('-') + 1), std::int32_t(d.ids.size())};
    std::fwrite(head, sizeof(std::int32_t), 3, d.out);
    std::fwrite(d.ids.data(), sizeof(std::int32_t), d.ids.size(), d.out);
    std::fwrite(t->data, sizeof(float), std::size_t(ggml_nelements(t)), d.out);
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  const char* routing = nullptr;
  bool f32_cache = false, bad = argc < 5;
  for (int a = 5; a < argc; ++a) {
    const std::string arg = argv[a];
    if (arg.rfind("routing=", 0) == 0) routing = argv[a] + 8;
    else if (arg == "kv=f32") f32_cache = true;
    else bad = true;
  }
  if (bad) {
    std::fprintf(stderr, "usage: llama_logits MODEL.gguf LOGITS.bin STEPS SEED [routing=FILE] [kv=f32]\n");
    return 2;
  }
  const int steps = std::atoi(argv[3]);
  const std::uint64_t seed = std::strtoull(argv[4], nullptr, 0);
  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  mp.n_gpu_layers = 0;
  llama_model* model = llama_model_load_from_file(argv[1], mp);
  if (!model) return 1;
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = 256, cp.n_batch = 1, cp.n_ubatch = 1, cp.n_seq_max = 1, cp.n_threads = 2, cp.n_threads_batch = 2;
  if (f32_cache) cp.type_k = GGML_TYPE_F32, cp.type_v = GGML_TYPE_F32;
  RoutingDump dump;
  if (routing) {
    dump.out = std::fopen(routing, "wb");
    cp.cb_eval = on_tensor, cp.cb_eval_user_data = &dump;
  }
  llama_context* ctx = llama_init_from_model(model, cp);
  if (!ctx) return 1;
  const int vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
  std::FILE* out = std::fopen(argv[2], "wb");
  for (int t = 0; t < steps; ++t) {
    dump.step = t;
    llama_batch b = llama_batch_init(1, 0, 1);
    b.n_tokens = 1, b.token[0] = agree::token(seed, t, vocab), b.pos[0] = t, b.n_seq_id[0] = 1, b.seq_id[0][0] = 0, b.logits[0] = 1;
    if (llama_decode(ctx, b) != 0) return 1;
    std::fwrite(llama_get_logits_ith(ctx, 0), sizeof(float), std::size_t(vocab), out);
    llama_batch_free(b);
  }
  std::fclose(out);
  if (dump.out) std::fclose(dump.out);
  llama_free(ctx);
  llama_model_free(model);
  return 0;
}
