// Standalone kernel and launcher of the embedding gather.
#include <algorithm>

#include <encore/pipeline/stage_params.h>

#include "common/cuda_check.h"
#include "common/block.h"
#include "common/pdl.cuh"
#include "common/launch.h"
#include "pipeline/step_tiles.cuh"

namespace encore::pipeline {
namespace {

__global__ void __launch_bounds__(kBlockThreads) embed_kernel(const __grid_constant__ EmbedParams p) {
  encore::device::PdlWait wait{false};
  embed_body(p, encore::device::GridRange{}, wait);
  encore::device::allow_downstream();
}

}  // namespace

Status embed(const EmbedParams& p, cudaStream_t stream) {
  ENCORE_RETURN_IF_ERROR(validate(p));
  ENCORE_RETURN_IF_ERROR(detail::check_stream(stream));
  return detail::launch(embed_kernel, p.batch, 0, stream, true, "embed_kernel", p);
}

}  // namespace encore::pipeline
