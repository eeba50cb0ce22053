// Standalone kernels and launchers of the embedding gather, alone or with the MLA scheduler.
#include <algorithm>

#include <encore/pipeline/stage_params.h>

#include "common/cuda_check.h"
#include "common/block.h"
#include "common/pdl.cuh"
#include "common/launch.h"
#include "mla/mla_tiles.cuh"
#include "pipeline/step_tiles.cuh"

namespace encore::pipeline {
namespace {

__global__ void __launch_bounds__(kBlockThreads) embed_kernel(const __grid_constant__ EmbedParams p) {
  encore::device::PdlWait wait{false};
  embed_body(p, encore::device::GridRange{}, wait);
  encore::device::allow_downstream();
}

// Blocks [0, batch) gather a row each; block `batch` runs the scheduler.
__global__ void __launch_bounds__(kBlockThreads) embed_and_mla_sched_kernel(const __grid_constant__ EmbedParams e,
                                                                            const __grid_constant__ ops::MlaSchedParams s) {
  extern __shared__ __align__(16) char smem[];
  encore::device::PdlWait wait{false};
  const int b = int(blockIdx.x);
  if (b < e.batch)
    embed_body(e, encore::device::TileRange{b, e.batch}, wait);
  else
    mla::mla_sched_body(s, encore::device::TileRange{0, 1}, smem, wait);
  encore::device::allow_downstream();
}

}  // namespace

Status embed(const EmbedParams& p, cudaStream_t stream) {
  ENCORE_RETURN_IF_ERROR(validate(p));
  ENCORE_RETURN_IF_ERROR(detail::check_stream(stream));
  return detail::launch(embed_kernel, p.batch, 0, stream, true, "embed_kernel", p);
}

Status embed_and_mla_sched(const EmbedParams& e, const ops::MlaSchedParams& s, cudaStream_t stream) {
  ENCORE_RETURN_IF_ERROR(validate(e));
  ENCORE_RETURN_IF_ERROR(ops::mla_validate(s));
  ENCORE_RETURN_IF_ERROR(detail::check_disjoint("embed_and_mla_sched", {{e.table, std::size_t(e.vocab) * e.hidden * 2, "table"},
                                                                          {e.token_ids, std::size_t(e.batch) * 4, "token_ids"},
                                                                          {s.seq_lens, std::size_t(s.batch) * 4, "seq_lens"},
                                                                          {s.positions, std::size_t(s.batch) * 4, "positions"},
                                                                          {s.cache.block_table, std::size_t(s.batch) * s.cache.block_table_stride * 4, "block_table"}},
                                                {{e.x, std::size_t(e.batch) * e.hidden * 4, "x"},
                                                 {s.part_plans, std::size_t(s.num_parts) * ops::kMlaPartPlanInts * 4, "part_plans"},
                                                 {s.num_splits, (std::size_t(s.batch) + 1) * 4, "num_splits"},
                                                 {s.error_flag, 4, "error_flag"}}));
  ENCORE_RETURN_IF_ERROR(detail::check_stream(stream));
  return detail::launch(embed_and_mla_sched_kernel, e.batch + 1, mla::mla_sched_smem_bytes(s.batch), stream, true,
                        "embed_and_mla_sched_kernel", e, s);
}

}  // namespace encore::pipeline
