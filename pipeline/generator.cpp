// Greedy generation on the device (include/encore/pipeline/generator.h, docs/generate.md).
#include <encore/pipeline/generator.h>

#include <algorithm>
#include <cstddef>

#include <encore/ops/mla.h>
#include <encore/ops/sample.h>

#include "common/cuda_check.h"

namespace encore::pipeline {
namespace {

std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

}  // namespace

Status Generator::create(Pipeline& pipeline, std::unique_ptr<Generator>& out) {
  const BufferOptions& o = pipeline.options();
  std::unique_ptr<Generator> g(new Generator(pipeline));
  g->capacity_ = o.max_pages_per_seq * ops::kMlaPageTokens;
  const std::size_t tokens = round_up(std::size_t(o.max_batch) * g->capacity_ * 4, 256);
  const std::size_t lens = round_up(std::size_t(o.max_batch) * 4, 256), flags = 256;
  const std::size_t workspace = ops::greedy_workspace_bytes(o.max_batch, pipeline.config().vocab);
  ENCORE_CUDA_TRY(cudaMalloc(&g->device_, tokens + lens + flags + workspace));
  char* base = static_cast<char*>(g->device_);
  g->tokens_ = reinterpret_cast<std::int32_t*>(base);
  g->prompt_lens_ = reinterpret_cast<std::int32_t*>(base + tokens);
  g->flags_ = reinterpret_cast<std::int32_t*>(base + tokens + lens);
  g->workspace_ = base + tokens + lens + flags;
  out = std::move(g);
  return {};
}

Generator::~Generator() {
  if (device_) cudaFree(device_);
}

Status Generator::start(const std::vector<std::vector<std::int32_t>>& prompts, int new_tokens, cudaStream_t stream) {
  const ModelConfig& c = pipeline_->config();
  const BufferOptions& o = pipeline_->options();
  const int rows = int(prompts.size());
  ENCORE_REQUIRE(rows >= 1 && rows <= pipeline_->batch() && rows <= o.max_slots, StatusCode::kOutOfRange, "Generator::start: ",
                 rows, " prompts; the pipeline runs 1..", std::min(pipeline_->batch(), o.max_slots), " rows");
  ENCORE_REQUIRE(new_tokens >= 1, StatusCode::kInvalidArgument, "Generator::start: new_tokens must be >= 1 (got ", new_tokens, ")");
  std::size_t longest = 0;
  for (int b = 0; b < rows; ++b) {
    ENCORE_REQUIRE(!prompts[b].empty(), StatusCode::kInvalidArgument, "Generator::start: prompt ", b, " is empty");
    for (const std::int32_t id : prompts[b])
      ENCORE_REQUIRE(id >= 0 && id < c.vocab, StatusCode::kOutOfRange, "Generator::start: prompt ", b, " has token id ", id,
                     " outside [0, ", c.vocab, ")");
    longest = std::max(longest, prompts[b].size());
  }
  // Row b feeds positions 0 .. len - 2 and needs room (history and a page) for position len - 1.
  const std::int64_t length = std::int64_t(longest) + new_tokens;
  ENCORE_REQUIRE(length <= capacity_, StatusCode::kOutOfRange, "Generator::start: the longest prompt (", longest, ") plus ",
                 new_tokens, " new tokens exceeds the ", capacity_, " tokens of a sequence (BufferOptions::max_pages_per_seq)");
  const bool paged = c.count(Attention::kMla) > 0;
  const int pages_per_row = int((length + ops::kMlaPageTokens - 1) / ops::kMlaPageTokens);
  ENCORE_REQUIRE(!paged || std::int64_t(rows) * pages_per_row <= o.max_pages, StatusCode::kOutOfRange, "Generator::start: ", rows,
                 " rows of ", pages_per_row, " cache pages exceed the pool's ", o.max_pages, " pages (BufferOptions::max_pages)");

  StepInputs in;
  std::vector<std::int32_t> history(std::size_t(rows) * capacity_, 0), lens(rows);
  in.block_table.assign(std::size_t(rows) * o.max_pages_per_seq, paged ? -1 : 0);
  for (int b = 0; b < rows; ++b) {
    in.token_ids.push_back(prompts[b][0]);
    in.positions.push_back(0), in.seq_lens.push_back(1), in.slot_ids.push_back(b);
    for (int i = 0; paged && i < pages_per_row; ++i) in.block_table[std::size_t(b) * o.max_pages_per_seq + i] = b * pages_per_row + i;
    std::copy(prompts[b].begin(), prompts[b].end(), history.begin() + std::ptrdiff_t(b) * capacity_);
    lens[b] = std::int32_t(prompts[b].size());
  }
  ENCORE_RETURN_IF_ERROR(detail::check_stream(stream));
  ENCORE_RETURN_IF_ERROR(pipeline_->set_step(in));
  ENCORE_RETURN_IF_ERROR(pipeline_->reset_state(stream));
  ENCORE_RETURN_IF_ERROR(pipeline_->enqueue_inputs(stream));
  ENCORE_CUDA_TRY(cudaMemcpyAsync(tokens_, history.data(), history.size() * 4, cudaMemcpyHostToDevice, stream));
  ENCORE_CUDA_TRY(cudaMemcpyAsync(prompt_lens_, lens.data(), lens.size() * 4, cudaMemcpyHostToDevice, stream));
  ENCORE_CUDA_TRY(cudaMemsetAsync(flags_, 0, 4, stream));
  rows_ = rows;
  steps_to_finish_ = int(length) - 1;
  steps_taken_ = 0;
  return {};
}

Status Generator::step(const DecodeStep& decode_step, cudaStream_t stream) {
  ENCORE_REQUIRE(rows_ > 0, StatusCode::kInvalidArgument, "Generator::step: start() first");
  ENCORE_REQUIRE(!decode_step.copies_staged_inputs(), StatusCode::kInvalidArgument, "Generator::step: the ", decode_step.path(),
                 " path was built with the staged inputs' copy, which would overwrite the sampled tokens (build it with "
                 "copy_staged_inputs = false)");
  ENCORE_REQUIRE(decode_step.batch() >= rows_, StatusCode::kOutOfRange, "Generator::step: the ", decode_step.path(),
                 " path was built for batch ", decode_step.batch(), "; ", rows_, " rows were started");
  const BufferOptions& o = pipeline_->options();
  auto step_buffer = [&](const char* name) { return static_cast<std::int32_t*>(pipeline_->buffer(name)); };
  ops::GreedyParams p;
  p.logits = pipeline_->logits(), p.logits_stride = pipeline_->config().vocab, p.vocab = pipeline_->config().vocab;
  p.batch = rows_;  // rows past the started ones stay pad rows: nothing to sample
  p.token_ids = step_buffer("step.token_ids"), p.positions = step_buffer("step.positions");
  p.seq_lens = step_buffer("step.seq_lens"), p.slot_ids = step_buffer("step.slot_ids");
  p.block_table = step_buffer("step.block_table"), p.max_pages_per_seq = o.max_pages_per_seq, p.max_pages = o.max_pages;
  p.page_size = ops::kMlaPageTokens;
  p.tokens = tokens_, p.prompt_lens = prompt_lens_, p.capacity = capacity_;
  p.workspace = workspace_, p.flags = flags_;
  ENCORE_RETURN_IF_ERROR(ops::validate(p));
  ENCORE_RETURN_IF_ERROR(decode_step.run(stream));
  ENCORE_RETURN_IF_ERROR(ops::greedy_next(p, stream));
  ++steps_taken_;
  return {};
}

Status Generator::read_tokens(cudaStream_t stream, std::vector<std::vector<std::int32_t>>& out) const {
  ENCORE_REQUIRE(rows_ > 0, StatusCode::kInvalidArgument, "Generator::read_tokens: start() first");
  std::vector<std::int32_t> positions(rows_), lens(rows_), history(std::size_t(rows_) * capacity_);
  ENCORE_CUDA_TRY(cudaMemcpyAsync(positions.data(), pipeline_->buffer("step.positions"), positions.size() * 4, cudaMemcpyDeviceToHost, stream));
  ENCORE_CUDA_TRY(cudaMemcpyAsync(lens.data(), prompt_lens_, lens.size() * 4, cudaMemcpyDeviceToHost, stream));
  ENCORE_CUDA_TRY(cudaMemcpyAsync(history.data(), tokens_, history.size() * 4, cudaMemcpyDeviceToHost, stream));
  ENCORE_CUDA_TRY(cudaStreamSynchronize(stream));
  out.assign(std::size_t(rows_), {});
  for (int b = 0; b < rows_; ++b) {
    const int count = std::min(capacity_, std::max(positions[b] + 1, lens[b]));
    const auto first = history.begin() + std::ptrdiff_t(b) * capacity_;
    out[b].assign(first, first + count);
  }
  return {};
}

}  // namespace encore::pipeline
