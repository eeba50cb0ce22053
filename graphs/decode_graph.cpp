#include <encore/graphs/decode_graph.h>

#include <utility>

#include "common/cuda_check.h"

namespace encore::graphs {

DecodeGraph::~DecodeGraph() { release(); }

DecodeGraph::DecodeGraph(DecodeGraph&& other) noexcept
    : graph_(std::exchange(other.graph_, nullptr)),
      exec_(std::exchange(other.exec_, nullptr)),
      pipeline_(std::exchange(other.pipeline_, nullptr)),
      batch_(std::exchange(other.batch_, 0)),
      copies_inputs_(other.copies_inputs_) {}

DecodeGraph& DecodeGraph::operator=(DecodeGraph&& other) noexcept {
  if (this != &other) {
    release();
    graph_ = std::exchange(other.graph_, nullptr);
    exec_ = std::exchange(other.exec_, nullptr);
    pipeline_ = std::exchange(other.pipeline_, nullptr);
    batch_ = std::exchange(other.batch_, 0);
    copies_inputs_ = other.copies_inputs_;
  }
  return *this;
}

void DecodeGraph::release() {
  if (exec_) cudaGraphExecDestroy(exec_);
  if (graph_) cudaGraphDestroy(graph_);
  exec_ = nullptr;
  graph_ = nullptr;
  pipeline_ = nullptr;
  batch_ = 0;
}

Status DecodeGraph::capture(pipeline::Pipeline& pipeline, cudaStream_t stream, DecodeGraph& out,
                            const DecodeGraphOptions& options) {
  out.release();
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  ENCORE_CUDA_TRY(cudaStreamIsCapturing(stream, &capturing));
  ENCORE_REQUIRE(capturing == cudaStreamCaptureStatusNone, StatusCode::kInvalidArgument,
                 "DecodeGraph::capture: the stream is already capturing");
  ENCORE_CUDA_TRY(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const Status enqueued =
      options.copy_staged_inputs ? pipeline.enqueue_step(stream) : pipeline::run_stages(pipeline.stages(), stream);
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(stream, &graph);  // always end, so the stream is usable again
  if (!enqueued.ok()) {
    if (graph) cudaGraphDestroy(graph);
    (void)cudaGetLastError();  // clear the (non-sticky) error a failed capture leaves; the status says why
    return Status(enqueued.code(), "DecodeGraph::capture: " + enqueued.message());
  }
  ENCORE_CUDA_TRY(ended);
  cudaGraphExec_t exec = nullptr;
  const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
  if (made != cudaSuccess) {
    cudaGraphDestroy(graph);
    return detail::cuda_status(made, "cudaGraphInstantiate (decode step)");
  }
  out.graph_ = graph;
  out.exec_ = exec;
  out.pipeline_ = &pipeline;
  out.batch_ = pipeline.batch();
  out.copies_inputs_ = options.copy_staged_inputs;
  return {};
}

Status DecodeGraph::replay(cudaStream_t stream) const {
  ENCORE_REQUIRE(exec_, StatusCode::kInvalidArgument, "DecodeGraph::replay: nothing captured");
  ENCORE_REQUIRE(!copies_inputs_ || pipeline_->staged_rows() <= batch_, StatusCode::kOutOfRange, "DecodeGraph::replay: the staged step has ",
                 pipeline_->staged_rows(), " rows; the graph was captured at batch ", batch_, " (capture again after set_batch)");
  ENCORE_CUDA_TRY(cudaGraphLaunch(exec_, stream));
  return {};
}

std::size_t DecodeGraph::num_nodes() const {
  std::size_t n = 0;
  if (graph_) cudaGraphGetNodes(graph_, nullptr, &n);
  return n;
}

Status DecodeGraph::add_as_child_node(cudaGraph_t parent, const cudaGraphNode_t* deps, std::size_t num_deps,
                                      cudaGraphNode_t* node) const {
  ENCORE_REQUIRE(graph_, StatusCode::kInvalidArgument, "DecodeGraph::add_as_child_node: nothing captured");
  ENCORE_REQUIRE(parent && node, StatusCode::kNullPointer, "DecodeGraph::add_as_child_node: parent and node are required");
  ENCORE_CUDA_TRY(cudaGraphAddChildGraphNode(node, parent, deps, num_deps, graph_));
  return {};
}

}  // namespace encore::graphs
