// One interface for the two ways encore runs a decode step, so host code replays either the same
// way: graphs::DecodeGraph (the captured CUDA graph) and pipeline::Megakernel (one cooperative
// persistent launch). Both read the inputs Pipeline::set_step staged and leave the logits in
// Pipeline::logits(); both are built once from a Pipeline and serve every token after.
//
//   std::unique_ptr<DecodeStep> step = ...;  // a DecodeGraph or a Megakernel
//   for each token: pipeline.set_step(inputs); step->run(stream); ...
#pragma once

#include <cuda_runtime.h>

#include <encore/status.h>

namespace encore::pipeline {

class DecodeStep {
 public:
  virtual ~DecodeStep() = default;
  // One decode step on `stream`: the staged inputs' copy, then the step. Asynchronous; capturable.
  virtual Status run(cudaStream_t stream) const = 0;
  // "graph" or "megakernel".
  virtual const char* path() const = 0;
};

}  // namespace encore::pipeline
