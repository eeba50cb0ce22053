// The hybrid model a decode step runs (docs/model.md): dims, the per-layer attention / MLP
// kinds, the routing of the MoE layers, and the bytes one step must move.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <encore/status.h>

namespace encore::pipeline {

enum class Attention { kKda, kMla };
enum class Mlp { kDense, kMoe };
enum class RouterScore { kSigmoid, kSoftmax };

struct KdaConfig {
  int heads = 32;
  int head_dim = 128;     // K = V
  int conv_kernel = 4;
  int gate_rank = 128;    // f_a / g_a low-rank width
  float l2_eps = 1e-6f;   // q/k L2 norm (inside the root)
};

struct MlaConfig {
  int heads = 32;
  int kv_lora_rank = 512;
  int rope_dim = 64;
  int nope_dim = 128;
  int v_dim = 128;
  int q_lora_rank = 0;     // 0: q_proj straight from the hidden state (Kimi)
  bool nope = true;        // rope dims present but never rotated (Kimi); false: DeepSeek RoPE + YaRN
  float softmax_scale = 0.07216878f;
};

struct MoeConfig {
  int experts = 256;
  int top_k = 8;
  int groups = 1;          // group stage runs only when groups > 1 and kept_groups < groups
  int kept_groups = 1;
  int shared_experts = 1;
  int expert_width = 1024;
  RouterScore score = RouterScore::kSigmoid;
  bool selection_bias = true;
  bool renormalise = true;
  float routed_scale = 2.446f;
};

struct ModelConfig {
  std::string name;
  int hidden = 2304;
  int vocab = 163840;
  float rms_eps = 1e-5f;
  int dense_width = 9216;  // SwiGLU width of the dense (non-MoE) layers
  KdaConfig kda;
  MlaConfig mla;
  MoeConfig moe;
  std::vector<Attention> attention;  // per layer, 0-based
  std::vector<Mlp> mlp;              // per layer, 0-based

  int layers() const { return int(attention.size()); }
  int count(Attention a) const;
  int count(Mlp m) const;

  // Kimi-Linear-48B-A3B as published (docs/model.md §1-§2).
  static ModelConfig kimi_linear_48b();
  // docs/model.md §6: production head dims, everything else shrunk; `rope` gives the DeepSeek-style
  // variant (RoPE + YaRN, q LoRA 256).
  static ModelConfig tiny(bool rope = false);
  // A tiny model a kimi-linear GGUF file can describe (one head count for KDA and MLA, no group
  // stage): 4 layers (dense KDA, MoE KDA, MoE MLA, MoE KDA), hidden 256, 8 heads, 16 experts.
  static ModelConfig tiny_kimi_linear();

  // The layer kinds from a checkpoint's 1-based `kda_layers` / `full_attn_layers` lists and its
  // `first_k_dense_replace`; every layer must be in exactly one list.
  static Status layers_from_lists(int layers, const std::vector<int>& kda_layers_1based,
                                  const std::vector<int>& full_attn_layers_1based, int first_dense_layers,
                                  ModelConfig& config);

  // The layer kinds from letter pairs, one per layer: K or M (KDA / MLA attention), then d or e
  // (dense / MoE MLP); e.g. "KdKeKeMe" is Kimi-Linear's first four layers. The dims are kept, so
  // kimi_linear_48b() with a short spec is a full-width model of a few layers.
  static Status layers_from_spec(std::string_view spec, ModelConfig& config);
  // The same model with every MLA layer made a KDA layer (the MLPs kept): what the megakernel can
  // run at two blocks per SM (MegakernelOptions::blocks_per_sm).
  ModelConfig with_kda_for_mla() const;

  // Every Q4_K input dim a multiple of 256, routing consistent (k <= kept * E / groups), ...
  Status validate() const;
};

// Bytes of the weights (as stored: Q4_K projections, bf16 f_b / g_b / W_UK / W_UV / router / embedding
// row, fp32 small tensors) read by one layer or the head.
struct LayerBytes {
  std::int64_t kda = 0, mla = 0, dense_mlp = 0, moe_router = 0, expert = 0, lm_head = 0, head_other = 0;
};
LayerBytes layer_bytes(const ModelConfig& c);

// Bytes one decode step moves for `batch` sequences at `context` tokens, with uniform routing
// (each MoE layer touches E * (1 - (1 - k/E)^batch) routed experts + the shared ones).
struct StepBytes {
  double weights = 0;       // everything read once per step (experts: the expected touched ones)
  double kda_state = 0;     // recurrent state read + write
  double kda_conv = 0;      // conv state read + write
  double mla_cache = 0;     // latent cache read
  double total() const { return weights + kda_state + kda_conv + mla_cache; }
};
StepBytes step_bytes(const ModelConfig& c, int batch, std::int64_t context);

}  // namespace encore::pipeline
