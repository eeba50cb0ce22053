// The graph path (docs/design.md): a decode step captured once into a CUDA graph and replayed for every
// token. Everything that changes per token lives in device memory (the step inputs the captured
// copy brings from the pipeline's pinned staging buffer, the split plan the scheduler stage
// computes), so one capture serves every token and every mix of lengths up to the pipeline's
// max_batch rows.
//
//   DecodeGraph g;
//   ENCORE_RETURN_IF_ERROR(DecodeGraph::capture(pipeline, stream, g));
//   for each token: pipeline.set_step(inputs); g.replay(stream); ...
//
// Consecutive kernels keep their programmatic-dependent-launch edges, so a kernel's weight
// prefetch overlaps its predecessor's tail. graph() can be embedded in a caller's own graph as a
// child node (add_as_child_node). The pipeline must outlive the graph.
#pragma once

#include <cstddef>

#include <cuda_runtime.h>

#include <encore/pipeline/decode_step.h>
#include <encore/pipeline/pipeline.h>
#include <encore/status.h>

namespace encore::graphs {

struct DecodeGraphOptions {
  // true: the step starts with the copy of Pipeline::set_step's pinned staging buffer. false: the
  // graph is the stages alone, for engines that write the step inputs (pipeline.buffer("step.*"))
  // into device memory themselves before each replay.
  bool copy_staged_inputs = true;
};

class DecodeGraph final : public pipeline::DecodeStep {
 public:
  DecodeGraph() = default;
  ~DecodeGraph() override;
  DecodeGraph(DecodeGraph&& other) noexcept;
  DecodeGraph& operator=(DecodeGraph&& other) noexcept;
  DecodeGraph(const DecodeGraph&) = delete;
  DecodeGraph& operator=(const DecodeGraph&) = delete;

  // Captures pipeline.enqueue_step (or its stages alone) on `stream` (which must not already be
  // capturing) at the pipeline's current batch, and instantiates it. On error nothing is kept and
  // the stream is left out of capture.
  static Status capture(pipeline::Pipeline& pipeline, cudaStream_t stream, DecodeGraph& out,
                        const DecodeGraphOptions& options = {});

  bool valid() const { return exec_ != nullptr; }
  // One decode step: the staged inputs' copy and every stage. kOutOfRange, with nothing launched,
  // when the staged step has more rows than the batch the graph was captured at.
  Status replay(cudaStream_t stream) const;
  int batch() const override { return batch_; }
  Status run(cudaStream_t stream) const override { return replay(stream); }
  const char* path() const override { return "graph"; }
  bool copies_staged_inputs() const override { return copies_inputs_; }
  // The captured graph (owned by this object): nodes and their count for inspection.
  cudaGraph_t graph() const { return graph_; }
  std::size_t num_nodes() const;
  // Adds the step to `parent` as one child-graph node after `deps` (the parent copies the graph).
  Status add_as_child_node(cudaGraph_t parent, const cudaGraphNode_t* deps, std::size_t num_deps, cudaGraphNode_t* node) const;

 private:
  void release();
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
  const pipeline::Pipeline* pipeline_ = nullptr;
  int batch_ = 0;
  bool copies_inputs_ = true;
};

}  // namespace encore::graphs
