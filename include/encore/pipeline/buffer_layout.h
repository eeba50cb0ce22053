// The per-step device memory of the decode pipeline (docs/model.md §3), sized for a maximum
// batch, and the state pools, sized for the slots and cache pages an engine wants resident.
//
// Step arena ("buffers"), reused by every layer (stages of one step run in order); B = max_batch,
// G = gemv_rows(B) (B up to 16, else B rounded up to a multiple of 16):
//   step.token_ids / positions / seq_lens / slot_ids  int32 [B]     StepInputs (pad row: slot < 0, len 0)
//   step.block_table   int32 [B][max_pages_per_seq]                  MLA pages of each sequence
//   x                  fp32 [G][hidden]   residual stream (the MoE ops normalise it themselves)
//   kda.proj           fp32 [G][kda_proj_stride]   [q | k | v | f_a | g_a | b] (kda.h row layout)
//   kda.y              fp32 [G][H*V]
//   mla.proj           fp32 [G][mla_proj_stride]   [q (or q_a) | kv_a]
//   mla.q              fp32 [G][H*192]    q LoRA configs only: q_b output
//   mla.q576 bf16, mla.o_lat, mla.lse, mla.partial_o, mla.partial_lse, mla.part_plans,
//   mla.num_splits     shapes as in ops/mla.h (partials: B + num_parts rows)
//   mla.v_out          fp32 [G][H*128]
//   mlp.mid            fp32 [G][dense_width]   dense layers only
//   moe.router_ws, moe.experts_ws        sized by the MoE op's own workspace queries
//   moe.router_counter                   int32, the one-kernel router's arrival counter (batch 1)
//   moe.topk_ids int32 / moe.topk_weights fp32 [B][top_k]
//   logits             fp32 [G][vocab]
//   flags.mla, flags.moe                 int32 error flags (sticky; the host reads them after a step)
// State arena: per KDA layer "blk.N.kda_recurrent" fp32 [slots][H][V][K] and "blk.N.kda_conv"
// fp32 [slots][3][3*H*K]; per MLA layer "blk.N.mla_cache" bf16 [pages][64][576] (one block table
// serves all MLA layers: a sequence uses the same page ids in each layer's pool).
#pragma once

#include <cstdint>

#include <encore/ops/q4k_gemv.h>
#include <encore/pipeline/model_config.h>
#include <encore/pipeline/tensor_arena.h>

namespace encore::pipeline {

// The most rows a step can have: the MoE op's limit (its work list tracks tokens in a 64-bit mask).
inline constexpr int kMaxPipelineBatch = 64;

struct BufferOptions {
  int max_batch = 16;           // 1..kMaxPipelineBatch
  int max_slots = 16;           // KDA state slots resident
  int max_pages = 64;           // MLA cache pages per MLA layer (64 tokens each)
  int max_pages_per_seq = 64;   // block table row length: context capacity = 64 * this
  int mla_num_parts = 0;        // split-KV scheduler parts: ops::mla_num_parts(heads) on the device
                                // the pipeline runs on (it reads the SM count, so the caller passes it)
  int mla_min_part_units = 1;   // ops::MlaSchedParams::min_part_units: fewer, longer splits for short steps
  // The Q4_K GEMV stages' core on both paths (kAuto: the launchers' default). Results round
  // differently per core; the graph and the megakernel still agree bit for bit.
  ops::GemvCore gemv_core = ops::GemvCore::kAuto;
};

// Above kGemvStageRows rows (the tier every core and shape takes) a step runs each Q4_K GEMV as
// stages of gemv_stage_rows rows: 32 where the fp16 core's wide tier takes the GEMV's K and
// matrices (ops::q4k_gemv_max_batch; the core asked for is kAuto or kMmaF16), else 16. The last
// stage of a GEMV may be 16 rows.
inline constexpr int kGemvStageRows = 16;
int gemv_stage_rows(std::int64_t k, int num_matrices, ops::GemvCore core);

// Rows of the buffers the Q4_K GEMVs read and write (x, the projections, logits): the batch, or
// above kGemvStageRows the next multiple of it, so that every stage runs all its rows at its tier
// (the rows past the batch are pad rows nothing else reads).
std::int64_t gemv_rows(int batch);

// Floats per row of the projection buffers (rounded up to a multiple of 4 for the ops' strides).
std::int64_t kda_proj_stride(const ModelConfig& c);
std::int64_t mla_proj_stride(const ModelConfig& c);
// Columns of mla.proj before kv_a: heads * 192, or q_lora_rank.
std::int64_t mla_q_columns(const ModelConfig& c);

Status validate(const BufferOptions& o);
Status build_buffer_layout(const ModelConfig& c, const BufferOptions& o, TensorArena& buffers);
Status build_state_layout(const ModelConfig& c, const BufferOptions& o, TensorArena& state);

}  // namespace encore::pipeline
