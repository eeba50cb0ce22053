// The `encore` command: `encore info --model F.gguf`, `encore generate --model F.gguf --prompt-ids
// 1,2,3 --steps N [--batch B] [--path graph|megakernel] [--logits-out FILE] [--gemv-core C]`
// (docs/generate.md).
#include <CLI/CLI.hpp>

#include <encore/pipeline/buffer_layout.h>

#include "cli.h"

int main(int argc, char** argv) {
  CLI::App app{"encore: Kimi-Linear decode on one Hopper GPU, from a kimi-linear GGUF file"};
  app.require_subcommand(1);

  std::string info_model;
  CLI::App* info = app.add_subcommand("info", "What a GGUF file holds and whether encore runs it (no GPU needed)");
  info->add_option("--model", info_model, "kimi-linear GGUF file")->required()->check(CLI::ExistingFile);

  encore::cli::GenerateOptions g;
  CLI::App* generate = app.add_subcommand("generate", "Feed a prompt one token per step, then generate greedily on the GPU");
  generate->add_option("--model", g.model_path, "kimi-linear GGUF file (projections in Q4_K)")->required()->check(CLI::ExistingFile);
  generate->add_option("--prompt-ids", g.prompt_ids, "prompt token ids, comma-separated (encore has no tokenizer)")
      ->required()
      ->delimiter(',')
      ->check(CLI::NonNegativeNumber);
  generate->add_option("--steps", g.steps, "new tokens per row")->check(CLI::Range(1, 1 << 20))->capture_default_str();
  generate->add_option("--batch", g.batch, "rows, each fed the same prompt")->check(CLI::Range(1, encore::pipeline::kMaxPipelineBatch))->capture_default_str();
  generate->add_option("--path", g.path, "decode path")->check(CLI::IsMember({"graph", "megakernel"}))->capture_default_str();
  generate->add_option("--logits-out", g.logits_out, "write every step's fp32 logits, raw little-endian [step][batch][vocab]");
  generate->add_option("--gemv-core", g.gemv_core, "the Q4_K GEMVs' core (auto: fp16 tensor cores from 5 rows; int8: int8 tensor cores there)")
      ->check(CLI::IsMember({"auto", "dp4a", "int8", "f16"}))
      ->capture_default_str();

  CLI11_PARSE(app, argc, argv);
  if (info->parsed()) return encore::cli::run_info(info_model);
  return encore::cli::run_generate(g);
}
