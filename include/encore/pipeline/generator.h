// Greedy generation on the device over a Pipeline and either decode path (docs/generate.md): the
// prompt is fed one token per step (encore has no prefill kernel), then each step's argmax becomes
// the next step's token, with ops::greedy_next advancing the step inputs in device memory. Steps
// replay back to back with no host read; the host reads the tokens when it wants them.
//
//   std::unique_ptr<Generator> gen;
//   ENCORE_RETURN_IF_ERROR(Generator::create(pipeline, gen));
//   DecodeGraph graph;  // or a Megakernel, built with copy_staged_inputs = false
//   ENCORE_RETURN_IF_ERROR(DecodeGraph::capture(pipeline, stream, graph, {.copy_staged_inputs = false}));
//   ENCORE_RETURN_IF_ERROR(gen->start({prompt}, new_tokens, stream));
//   for (int i = 0; i < gen->steps_to_finish(); ++i) ENCORE_RETURN_IF_ERROR(gen->step(graph, stream));
//   ENCORE_RETURN_IF_ERROR(gen->read_tokens(stream, tokens));
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <cuda_runtime.h>

#include <encore/pipeline/decode_step.h>
#include <encore/pipeline/pipeline.h>
#include <encore/status.h>

namespace encore::pipeline {

class Generator {
 public:
  // Allocates the token history (max_batch rows of max_pages_per_seq * 64 tokens), the prompt
  // lengths, the sampler's workspace and its flag. The pipeline must outlive the generator.
  static Status create(Pipeline& pipeline, std::unique_ptr<Generator>& out);
  ~Generator();
  Generator(const Generator&) = delete;
  Generator& operator=(const Generator&) = delete;

  // Starts row b on prompts[b] (1 <= rows <= the pipeline's batch and max_slots; every prompt
  // non-empty, ids in [0, vocab)), with room for `new_tokens` more: row b takes slot b and, when
  // the model has MLA layers, its own pages. Resets every KDA state and MLA cache (the pipeline's
  // reset_state), stages and enqueues the first step's inputs and uploads the prompts. Checked on
  // the host first: nothing is enqueued when a prompt, the room or the pages do not fit.
  Status start(const std::vector<std::vector<std::int32_t>>& prompts, int new_tokens, cudaStream_t stream);

  // One decode step and the greedy advance, on `stream`. The step must be built from this
  // generator's pipeline without the staged inputs' copy (copies_staged_inputs() false) for at
  // least the started rows. Asynchronous; no host read.
  Status step(const DecodeStep& decode_step, cudaStream_t stream);
  // Steps until every row has its prompt and new_tokens generated: max prompt length + new_tokens - 1.
  int steps_to_finish() const { return steps_to_finish_; }
  int steps_taken() const { return steps_taken_; }

  // Each started row's tokens so far: its prompt, then what it generated. Synchronises `stream`.
  // Stepped beyond steps_to_finish, a row stops where its pages or the history end (a pad row
  // from then on) and keeps its tokens.
  Status read_tokens(cudaStream_t stream, std::vector<std::vector<std::int32_t>>& out) const;

  int capacity() const { return capacity_; }

 private:
  explicit Generator(Pipeline& pipeline) : pipeline_(&pipeline) {}
  Pipeline* pipeline_;
  void* device_ = nullptr;  // tokens [max_batch][capacity] | prompt_lens [max_batch] | flags | workspace
  std::int32_t* tokens_ = nullptr;
  std::int32_t* prompt_lens_ = nullptr;
  std::int32_t* flags_ = nullptr;
  void* workspace_ = nullptr;
  int capacity_ = 0, rows_ = 0, steps_to_finish_ = 0, steps_taken_ = 0;
};

}  // namespace encore::pipeline
