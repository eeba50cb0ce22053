// Writes a random kimi-linear GGUF file (save_gguf of fill_random_weights_host), for the encore
// command's tests and the GPU check's full-size generation run:
//   encore_write_gguf OUT.gguf [tiny | kimi | SPEC] [SEED]
// tiny: ModelConfig::tiny_kimi_linear() (12 MB); kimi: Kimi-Linear-48B-A3B (28 GB); SPEC: its
// dims with the layers SPEC lists (ModelConfig::layers_from_spec, e.g. KdKeMe).
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <encore/pipeline/gguf_model.h>
#include <encore/pipeline/random_weights.h>
#include <encore/pipeline/weight_layout.h>

int main(int argc, char** argv) {
  using namespace encore::pipeline;
  if (argc < 2 || argc > 4) {
    std::fprintf(stderr, "usage: encore_write_gguf OUT.gguf [tiny | kimi | SPEC] [SEED]\n");
    return 2;
  }
  const std::string model = argc > 2 ? argv[2] : "tiny";
  ModelConfig c = ModelConfig::tiny_kimi_linear();
  if (model != "tiny") {
    c = ModelConfig::kimi_linear_48b();
    if (model != "kimi") {
      if (const encore::Status s = ModelConfig::layers_from_spec(model, c); !s.ok()) {
        std::fprintf(stderr, "encore_write_gguf: %s\n", s.to_string().c_str());
        return 2;
      }
      c.name += "-" + model;
    }
  }
  TensorArena layout;
  encore::throw_if_error(build_weight_layout(c, layout));
  std::vector<unsigned char> weights(std::size_t(layout.total_bytes()));
  fill_random_weights_host(layout, weights.data(), argc > 3 ? std::strtoull(argv[3], nullptr, 0) : 1);
  encore::throw_if_error(save_gguf(argv[1], c, layout, weights.data()));
  std::printf("encore_write_gguf: %s (%s, %.2f GB of weights)\n", argv[1], c.name.c_str(), double(layout.total_bytes()) / 1e9);
  return 0;
}
