// llama.cpp's side of the agreement run (built by bench/agree/run.sh against a llama.cpp checkout
// in peers/, never part of encore's build): the model on the CPU, one token per step, logits out.
//
//   llama_logits MODEL.gguf LOGITS.bin STEPS SEED
#include <cstdio>
#include <cstdlib>

#include "agree_tokens.h"
#include "llama.h"

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: llama_logits MODEL.gguf LOGITS.bin STEPS SEED\n");
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
  llama_context* ctx = llama_init_from_model(model, cp);
  if (!ctx) return 1;
  const int vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
  std::FILE* out = std::fopen(argv[2], "wb");
  for (int t = 0; t < steps; ++t) {
    llama_batch b = llama_batch_init(1, 0, 1);
    b.n_tokens = 1, b.token[0] = agree::token(seed, t, vocab), b.pos[0] = t, b.n_seq_id[0] = 1, b.seq_id[0][0] = 0, b.logits[0] = 1;
    if (llama_decode(ctx, b) != 0) return 1;
    std::fwrite(llama_get_logits_ith(ctx, 0), sizeof(float), std::size_t(vocab), out);
    llama_batch_free(b);
  }
  std::fclose(out);
  llama_free(ctx);
  llama_model_free(model);
  return 0;
}
