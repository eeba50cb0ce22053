// The `encore` command (docs/generate.md): `info` describes a kimi-linear GGUF file and what encore
// would make of it; `generate` runs it greedily on the GPU. Each returns the process exit code.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace encore::cli {

int run_info(const std::string& model_path);

struct GenerateOptions {
  std::string model_path;
  std::vector<std::int32_t> prompt_ids;
  int steps = 16;             // new tokens per row
  int batch = 1;              // rows, each fed the same prompt
  std::string path = "graph"; // "graph" or "megakernel"
  std::string logits_out;     // raw fp32 [step][batch][vocab], empty: none
  std::string gemv_core = "auto";  // the Q4_K GEMVs' core: auto, dp4a, int8 or f16 (BufferOptions::gemv_core)
};
int run_generate(const GenerateOptions& options);

}  // namespace encore::cli
