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
  // One decode step on `stream`: the staged inputs' copy (when built with it), then the step.
  // Asynchronous; capturable.
  virtual Status run(cudaStream_t stream) const = 0;
  // "graph" or "megakernel".
  virtual const char* path() const = 0;
  // Whether run() starts with the staged inputs' copy. Built without it (copy_staged_inputs =
  // false), the step reads the inputs already in the pipeline's buffers, as a device-side sampler
  // leaves them (pipeline::Generator).
  virtual bool copies_staged_inputs() const = 0;
  // The batch the step was built for (rows beyond the staged ones are pad rows).
  virtual int batch() const = 0;
};

}  // namespace encore::pipeline
