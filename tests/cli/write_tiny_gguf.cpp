// Writes ModelConfig::tiny_kimi_linear() with random weights as a kimi-linear GGUF file, for the
// encore command's tests: write_tiny_gguf OUT.gguf [SEED]
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <encore/pipeline/gguf_model.h>
#include <encore/pipeline/random_weights.h>
#include <encore/pipeline/weight_layout.h>

int main(int argc, char** argv) {
  using namespace encore::pipeline;
  if (argc < 2) {
    std::fprintf(stderr, "usage: write_tiny_gguf OUT.gguf [SEED]\n");
    return 2;
  }
  const ModelConfig c = ModelConfig::tiny_kimi_linear();
  TensorArena layout;
  encore::throw_if_error(build_weight_layout(c, layout));
  std::vector<unsigned char> weights(std::size_t(layout.total_bytes()));
  fill_random_weights_host(layout, weights.data(), argc > 2 ? std::strtoull(argv[2], nullptr, 0) : 1);
  encore::throw_if_error(save_gguf(argv[1], c, layout, weights.data()));
  return 0;
}
