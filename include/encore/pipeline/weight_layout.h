// Every weight tensor of a model in one arena (docs/model.md §5 for the dtypes): Q4_K
// projections, bf16 embedding / f_b / g_b / kv_b / router, fp32 norms, conv taps and gate vectors.
// Names follow GGUF ("blk.<layer>.attn_q.weight"), with two departures where encore's layout
// differs from the file's: "blk.N.ssm_a_log" holds A_log (GGUF's ssm_a holds -exp(A_log)), and
// "blk.N.attn_kv_b.weight" is kv_b_proj as [heads][256][512] (W_UK rows then W_UV rows per head),
// which the loader assembles from GGUF's attn_k_b / attn_v_b.
//
// Tensors that one op reads through a single pointer follow each other directly:
//   KDA   attn_q | attn_k | attn_v | ssm_f_a | ssm_g_a | ssm_beta   (one in-proj GEMV, kda.h row layout)
//         ssm_conv1d_q | _k | _v                                      (conv_weight [3*H*K][4])
//   MLA   attn_q (or attn_q_a) | attn_kv_a_mqa                         (one in-proj GEMV)
//   MoE   ffn_{gate,up,down}_exps | ffn_{gate,up,down}_shexp         (shared experts appended, moe.h)
#pragma once

#include <string>

#include <encore/pipeline/model_config.h>
#include <encore/pipeline/tensor_arena.h>

namespace encore::pipeline {

// "blk.<layer>.<base>" (no suffix added).
std::string layer_tensor(int layer, const char* base);

// Builds the table for a valid config (config.validate() is checked first).
Status build_weight_layout(const ModelConfig& c, TensorArena& weights);

}  // namespace encore::pipeline
