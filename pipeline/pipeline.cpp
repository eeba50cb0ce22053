#include <encore/pipeline/pipeline.h>

#include <cstring>
#include <set>
#include <string>

#include <encore/ops/mla.h>
#include <encore/pipeline/random_weights.h>
#include <encore/pipeline/weight_layout.h>

#include "common/cuda_check.h"

namespace encore::pipeline {
namespace {

// The step-input tensors, in arena order (build_buffer_layout adds them first).
constexpr const char* kStepTensors[] = {"step.token_ids", "step.positions", "step.seq_lens", "step.slot_ids", "step.block_table"};

Status check_row(const ModelConfig& c, const BufferOptions& o, const StepInputs& in, int b) {
  const std::int32_t slot = in.slot_ids[b], len = in.seq_lens[b], pos = in.positions[b], tok = in.token_ids[b];
  ENCORE_REQUIRE(tok >= 0 && tok < c.vocab, StatusCode::kOutOfRange, "step: row ", b, " token id ", tok, " outside [0, ", c.vocab, ")");
  if (slot == -1) {
    ENCORE_REQUIRE(len == 0, StatusCode::kInvalidArgument, "step: pad row ", b, " (slot -1) must have seq_len 0, got ", len);
    return {};
  }
  ENCORE_REQUIRE(slot >= 0 && slot < o.max_slots, StatusCode::kOutOfRange, "step: row ", b, " slot ", slot,
                 " outside [0, ", o.max_slots, ") (use -1 for a pad row)");
  ENCORE_REQUIRE(pos >= 0 && len == pos + 1, StatusCode::kInvalidArgument, "step: row ", b, " needs seq_len == position + 1 (got ",
                 len, ", ", pos, ")");
  const std::int64_t capacity = std::int64_t(o.max_pages_per_seq) * ops::kMlaPageTokens;
  ENCORE_REQUIRE(len <= capacity, StatusCode::kOutOfRange, "step: row ", b, " seq_len ", len, " exceeds the block table's ", capacity,
                 " tokens");
  if (c.count(Attention::kMla) == 0) return {};
  const int pages = (len + ops::kMlaPageTokens - 1) / ops::kMlaPageTokens;
  for (int i = 0; i < pages; ++i) {
    const std::int32_t page = in.block_table[std::size_t(b) * o.max_pages_per_seq + i];
    ENCORE_REQUIRE(page >= 0 && page < o.max_pages, StatusCode::kOutOfRange, "step: row ", b, " page ", page, " (block ", i,
                   ") outside [0, ", o.max_pages, ")");
  }
  return {};
}

}  // namespace

// Far-apart, aligned stand-ins for the three arenas: the stage table's host checks (pointers,
// alignment, overlaps) hold for them exactly as for the real allocations.
const ArenaBases kStandInBases{reinterpret_cast<void*>(std::uintptr_t(1) << 44), reinterpret_cast<void*>(std::uintptr_t(2) << 44),
                               reinterpret_cast<void*>(std::uintptr_t(3) << 44)};

Status Pipeline::create(const ModelConfig& config, const BufferOptions& options, std::unique_ptr<Pipeline>& out) {
  out.reset();
  std::unique_ptr<Pipeline> p(new Pipeline());
  p->config_ = config;
  p->options_ = options;
  if (p->options_.mla_num_parts == 0) p->options_.mla_num_parts = ops::mla_num_parts(config.mla.heads);
  ENCORE_RETURN_IF_ERROR(build_weight_layout(p->config_, p->weight_layout_));
  ENCORE_RETURN_IF_ERROR(build_buffer_layout(p->config_, p->options_, p->buffer_layout_));
  ENCORE_RETURN_IF_ERROR(build_state_layout(p->config_, p->options_, p->state_layout_));

  {  // the stage table over stand-in bases: bad dims, eps or counts are refused before any allocation
    std::vector<Stage> check;
    ENCORE_RETURN_IF_ERROR(p->build_stages(kStandInBases, p->options_.max_batch, check));
  }
  const TensorInfo* first = p->buffer_layout_.find(kStepTensors[0]);
  const TensorInfo* last = p->buffer_layout_.find(kStepTensors[4]);
  p->staging_offset_ = first->offset;
  p->staging_bytes_ = last->offset + last->bytes - first->offset;

  ENCORE_CUDA_TRY(cudaMalloc(&p->weights_, std::size_t(p->weight_layout_.total_bytes())));
  ENCORE_CUDA_TRY(cudaMalloc(&p->buffers_, std::size_t(p->buffer_layout_.total_bytes())));
  ENCORE_CUDA_TRY(cudaMalloc(&p->state_, std::size_t(std::max<std::int64_t>(p->state_layout_.total_bytes(), 256))));
  ENCORE_CUDA_TRY(cudaMallocHost(&p->staging_, std::size_t(p->staging_bytes_)));
  ENCORE_CUDA_TRY(cudaMemset(p->buffers_, 0, std::size_t(p->buffer_layout_.total_bytes())));
  // (the legacy stream's memset is not ordered before work on the caller's non-blocking streams)
  ENCORE_CUDA_TRY(cudaDeviceSynchronize());
  std::memset(p->staging_, 0, std::size_t(p->staging_bytes_));

  ENCORE_RETURN_IF_ERROR(p->set_batch(p->options_.max_batch));
  StepInputs pad;  // every row a pad row until the first set_step
  ENCORE_RETURN_IF_ERROR(p->set_step(pad));
  out = std::move(p);
  return {};
}

Status Pipeline::set_batch(int rows) {
  ENCORE_REQUIRE(rows >= 1 && rows <= options_.max_batch, StatusCode::kOutOfRange, "pipeline: batch ", rows, " outside [1, ",
                 options_.max_batch, "]");
  std::vector<Stage> stages;
  ENCORE_RETURN_IF_ERROR(build_stages(ArenaBases{weights_, buffers_, state_}, rows, stages));
  stages_ = std::move(stages);
  batch_ = rows;
  return {};
}

Status Pipeline::set_gemv_core(ops::GemvCore core) {
  BufferOptions next = options_;
  next.gemv_core = core;
  ENCORE_RETURN_IF_ERROR(validate(next));
  const BufferOptions previous = options_;
  options_ = next;
  const Status s = set_batch(batch_);
  if (!s.ok()) options_ = previous;
  return s;
}

Status Pipeline::build_stages(const ArenaBases& bases, int rows, std::vector<Stage>& out) const {
  StageListInputs in;
  in.config = &config_, in.options = &options_;
  in.weights = &weight_layout_, in.buffers = &buffer_layout_, in.state = &state_layout_;
  in.bases = bases;
  in.batch = rows;
  ENCORE_RETURN_IF_ERROR(build_stage_list(in, out));
  for (std::size_t i = 0; i < out.size(); ++i) {
    const Status s = validate_stage(out[i]);
    if (!s.ok()) return Status(s.code(), "pipeline: stage " + std::to_string(i) + ": " + s.message());
  }
  return {};
}

Pipeline::~Pipeline() {
  // Destructors cannot report; errors here mean the context is already broken.
  if (staging_) cudaFreeHost(staging_);
  if (state_) cudaFree(state_);
  if (buffers_) cudaFree(buffers_);
  if (weights_) cudaFree(weights_);
}

void* Pipeline::buffer(std::string_view name) const {
  const TensorInfo* t = buffer_layout_.find(name);
  return t ? static_cast<char*>(buffers_) + t->offset : nullptr;
}

void* Pipeline::state_tensor(std::string_view name) const {
  const TensorInfo* t = state_layout_.find(name);
  return t ? static_cast<char*>(state_) + t->offset : nullptr;
}

Status Pipeline::fill_random_weights(std::uint64_t seed, cudaStream_t stream) {
  return pipeline::fill_random_weights(weight_layout_, weights_, seed, stream);
}

Status Pipeline::reset_state(cudaStream_t stream) {
  ENCORE_CUDA_TRY(cudaMemsetAsync(state_, 0, std::size_t(state_layout_.total_bytes()), stream));
  for (const char* word : {"flags.mla", "flags.moe", "moe.router_counter"})
    if (void* f = buffer(word)) ENCORE_CUDA_TRY(cudaMemsetAsync(f, 0, sizeof(std::int32_t), stream));
  return {};
}

Status Pipeline::set_step(const StepInputs& in) {
  const std::size_t n = in.token_ids.size();
  const int B = options_.max_batch, P = options_.max_pages_per_seq;
  ENCORE_REQUIRE(n <= std::size_t(batch_), StatusCode::kOutOfRange, "step: ", n, " rows exceed the batch ", batch_,
                 " the stages run (set_batch)");
  ENCORE_REQUIRE(in.positions.size() == n && in.seq_lens.size() == n && in.slot_ids.size() == n &&
                     in.block_table.size() == n * std::size_t(P),
                 StatusCode::kInvalidArgument, "step: token_ids, positions, seq_lens and slot_ids need one entry per row and "
                 "block_table max_pages_per_seq (", P, ") per row");
  std::set<std::int32_t> slots;
  std::set<std::int32_t> write_pages;  // the page each row appends its token to: owned by that row alone
  for (std::size_t b = 0; b < n; ++b) {
    ENCORE_RETURN_IF_ERROR(check_row(config_, options_, in, int(b)));
    if (in.slot_ids[b] < 0) continue;
    ENCORE_REQUIRE(slots.insert(in.slot_ids[b]).second, StatusCode::kInvalidArgument, "step: slot ", in.slot_ids[b],
                   " appears twice in one step");
    if (config_.count(Attention::kMla) > 0)
      ENCORE_REQUIRE(write_pages.insert(in.block_table[b * P + in.positions[b] / ops::kMlaPageTokens]).second,
                     StatusCode::kInvalidArgument, "step: row ", b, " appends to a page another row appends to");
  }
  for (std::size_t b = 0; b < n; ++b) {  // no row may read a page another row writes
    if (in.slot_ids[b] < 0 || config_.count(Attention::kMla) == 0) continue;
    const int pages = (in.seq_lens[b] + ops::kMlaPageTokens - 1) / ops::kMlaPageTokens;
    const std::int32_t own = in.block_table[b * P + in.positions[b] / ops::kMlaPageTokens];
    for (int i = 0; i < pages; ++i) {
      const std::int32_t page = in.block_table[b * P + i];
      ENCORE_REQUIRE(page == own || !write_pages.count(page), StatusCode::kInvalidArgument, "step: row ", b, " reads page ", page,
                     " that another row appends to");
    }
  }
  // Valid: write every row (pad rows past n) at the arena's offsets inside the staging span.
  char* base = static_cast<char*>(staging_) - staging_offset_;
  auto row_ptr = [&](const char* name) { return reinterpret_cast<std::int32_t*>(base + buffer_layout_.find(name)->offset); };
  std::int32_t *tok = row_ptr("step.token_ids"), *pos = row_ptr("step.positions"), *len = row_ptr("step.seq_lens"),
               *slot = row_ptr("step.slot_ids"), *table = row_ptr("step.block_table");
  for (int b = 0; b < B; ++b) {
    const bool real = std::size_t(b) < n;
    tok[b] = real ? in.token_ids[b] : 0;
    pos[b] = real ? in.positions[b] : 0;
    len[b] = real ? in.seq_lens[b] : 0;
    slot[b] = real ? in.slot_ids[b] : -1;
    for (int i = 0; i < P; ++i) table[std::size_t(b) * P + i] = real ? in.block_table[std::size_t(b) * P + i] : 0;
  }
  staged_rows_ = int(n);
  return {};
}

Status Pipeline::enqueue_inputs(cudaStream_t stream) {
  ENCORE_RETURN_IF_ERROR(detail::check_stream(stream));
  ENCORE_CUDA_TRY(cudaMemcpyAsync(static_cast<char*>(buffers_) + staging_offset_, staging_, std::size_t(staging_bytes_),
                                  cudaMemcpyHostToDevice, stream));
  return {};
}

Status Pipeline::enqueue_step(cudaStream_t stream) {
  ENCORE_RETURN_IF_ERROR(enqueue_inputs(stream));
  return run_stages(stages_, stream);
}

Status Pipeline::read_errors(cudaStream_t stream) {
  std::int32_t bits[2] = {0, 0};
  const char* names[2] = {"flags.mla", "flags.moe"};
  for (int i = 0; i < 2; ++i)
    if (void* f = buffer(names[i])) ENCORE_CUDA_TRY(cudaMemcpyAsync(&bits[i], f, sizeof(std::int32_t), cudaMemcpyDeviceToHost, stream));
  ENCORE_CUDA_TRY(cudaStreamSynchronize(stream));
  for (int i = 0; i < 2; ++i)
    if (bits[i]) {
      ENCORE_CUDA_TRY(cudaMemsetAsync(buffer(names[i]), 0, sizeof(std::int32_t), stream));
      ENCORE_CUDA_TRY(cudaStreamSynchronize(stream));
      return Status(StatusCode::kOutOfRange,
                    std::string("pipeline: the device flagged bad step input in ") + (i == 0 ? "MLA" : "MoE") + " (bits " +
                        std::to_string(bits[i]) + "); the flagged stages wrote nothing");
    }
  return {};
}

}  // namespace encore::pipeline
