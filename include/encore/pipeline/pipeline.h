// A decode pipeline on one device (docs/design.md): the model's weights, state pools and step buffers
// in three arenas allocated once at creation, the stage table over them, and the per-step inputs.
// A step = one copy of the staged StepInputs (pinned host memory -> the step arena) followed by
// every stage of the table; `enqueue_step` issues it on a stream, graphs::DecodeGraph captures it
// once and replays it for every token.
//
//   std::unique_ptr<Pipeline> p;
//   ENCORE_RETURN_IF_ERROR(Pipeline::create(ModelConfig::kimi_linear_48b(), options, p));
//   // load weights into p->weights() following p->weight_layout() (or fill_random_weights)
//   p->reset_state(stream);
//   for each token: p->set_step(inputs); p->enqueue_step(stream); read p->logits() ...
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include <cuda_runtime.h>

#include <encore/pipeline/buffer_layout.h>
#include <encore/pipeline/model_config.h>
#include <encore/pipeline/stage_list.h>
#include <encore/pipeline/tensor_arena.h>
#include <encore/status.h>

namespace encore::pipeline {

// One step's per-row inputs for rows 0..n-1 (n <= batch(); rows n.. become pad rows). A pad row
// (slot -1, seq_len 0) touches no state or cache. Row b's MLA pages are
// block_table[b * max_pages_per_seq + i] for the ceil(seq_len / 64) pages in use.
struct StepInputs {
  std::vector<std::int32_t> token_ids, positions, seq_lens, slot_ids;
  std::vector<std::int32_t> block_table;  // [n][max_pages_per_seq]
};

class Pipeline {
 public:
  // Builds the layouts and the stage table (for max_batch rows), validates every stage on the host,
  // then allocates the three arenas and the pinned staging buffer (nothing is allocated when the
  // model or the options are refused). options.mla_num_parts = 0 takes ops::mla_num_parts(heads) of the
  // current device.
  static Status create(const ModelConfig& config, const BufferOptions& options, std::unique_ptr<Pipeline>& out);
  ~Pipeline();
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  const ModelConfig& config() const { return config_; }
  const BufferOptions& options() const { return options_; }
  const TensorArena& weight_layout() const { return weight_layout_; }
  const TensorArena& buffer_layout() const { return buffer_layout_; }
  const TensorArena& state_layout() const { return state_layout_; }
  void* weights() const { return weights_; }
  void* buffers() const { return buffers_; }
  void* state() const { return state_; }
  // The stage table of the current batch: `batch` rows (max_batch after create). A captured graph
  // serves the batch it was captured at; rows of a step beyond the real ones are pad rows.
  const std::vector<Stage>& stages() const { return stages_; }
  int batch() const { return batch_; }
  // Rebuilds the stage table for 1 <= rows <= max_batch (host only; unchanged on error). Kernels
  // then run on `rows` rows only, so a small batch does not pay for max_batch.
  Status set_batch(int rows);
  // Rebuilds the stage table of the current batch with the GEMV stages on `core` (BufferOptions::
  // gemv_core; host only; unchanged on error). Graphs and megakernels built before keep theirs.
  Status set_gemv_core(ops::GemvCore core);
  // Device pointer of a named tensor of the buffer or state arena (null if absent).
  void* buffer(std::string_view name) const;
  void* state_tensor(std::string_view name) const;
  // [gemv_rows(max_batch)][vocab]: the step's rows first; rows past them are the GEMVs' pad rows.
  const float* logits() const { return static_cast<const float*>(buffer("logits")); }

  // Synthetic weights (random_weights.h) for tests and benchmarks.
  Status fill_random_weights(std::uint64_t seed, cudaStream_t stream);
  // Zeroes every KDA state and MLA cache page and clears the error flags and the router's arrival
  // counter (asynchronous). After an abandoned megakernel launch, call it before the next step.
  Status reset_state(cudaStream_t stream);

  // Checks the inputs on the host (token ids < vocab; slots in [0, max_slots) and distinct, or -1
  // for a pad row; seq_len == position + 1 within the block table's capacity, or 0 for a pad row;
  // the pages in use in [0, max_pages)) and writes them into the pinned staging buffer, which the
  // next step copies to the device. Nothing is written on error. The staging buffer is read by the
  // device when the step runs: call this only once the previous step's copy has executed (e.g. after
  // synchronising on its logits).
  Status set_step(const StepInputs& in);
  // Rows of the last set_step (0 before the first): a step built for fewer rows refuses to run.
  int staged_rows() const { return staged_rows_; }
  // The whole step on `stream`: the staged inputs' copy, then every stage. Capturable.
  Status enqueue_step(cudaStream_t stream);
  // Its first half, the copy alone: a caller may then run the stages itself (run_stage), e.g. to
  // look at intermediate buffers between them.
  Status enqueue_inputs(cudaStream_t stream);
  // Host read of the sticky error flags of the MLA and MoE stages (synchronises `stream`; call
  // outside a step). Returns the first error and clears the flags.
  Status read_errors(cudaStream_t stream);

 private:
  Pipeline() = default;
  Status build_stages(const ArenaBases& bases, int rows, std::vector<Stage>& out) const;
  ModelConfig config_;
  BufferOptions options_;
  TensorArena weight_layout_, buffer_layout_, state_layout_;
  std::vector<Stage> stages_;
  int batch_ = 0;
  int staged_rows_ = 0;
  void* weights_ = nullptr;
  void* buffers_ = nullptr;
  void* state_ = nullptr;
  void* staging_ = nullptr;          // pinned mirror of the step-input span of the buffer arena
  std::int64_t staging_offset_ = 0;  // the span: [offset, offset + bytes) of the buffer arena
  std::int64_t staging_bytes_ = 0;
};

}  // namespace encore::pipeline
