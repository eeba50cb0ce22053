// Standalone kernels and launchers of the small MLA stages: scheduler, append, q absorption,
// combine, V up-projection. Each kernel maps blocks onto its body's tiles (grid-stride).
#include <algorithm>

#include <encore/ops/mla.h>

#include "common/cuda_check.h"
#include "common/block.h"
#include "common/pdl.cuh"
#include "common/launch.h"
#include "mla/mla_splitkv_tile.cuh"
#include "mla/mla_tiles.cuh"

namespace encore::ops {
namespace {

using namespace encore::mla;

__global__ void __launch_bounds__(kBlockThreads) mla_sched_kernel(const __grid_constant__ MlaSchedParams p) {
  extern __shared__ __align__(16) char smem[];
  encore::device::PdlWait wait{false};
  mla_sched_body(p, encore::device::GridRange{}, smem, wait);
  encore::device::allow_downstream();
}

// Dependents start right after the wait: split-KV with a settled plan starts its older pages
// during the append (its own wait still covers the newest rows written here).
__global__ void __launch_bounds__(kBlockThreads) mla_kv_append_kernel(const __grid_constant__ MlaKvAppendParams p) {
  extern __shared__ __align__(16) char smem[];
  encore::device::PdlWait wait;
  mla_kv_append_body(p, encore::device::GridRange{}, smem, wait);
}

__global__ void __launch_bounds__(kBlockThreads) mla_q_absorb_kernel(const __grid_constant__ MlaQAbsorbParams p) {
  extern __shared__ __align__(16) char smem[];
  encore::device::PdlWait wait{false};
  mla_q_absorb_body(p, encore::device::GridRange{}, smem, wait);
  encore::device::allow_downstream();
}

// Both in one grid: blocks [0, absorb_blocks) take the absorption's tiles, the others the append's
// rows, each with its own kernel's wait and release (the absorption releases its dependents when
// done, the append right after its wait). Four blocks per SM, as the launcher plans the absorption.
__global__ void __launch_bounds__(kBlockThreads, 4) mla_q_absorb_append_kernel(const __grid_constant__ MlaQAbsorbParams q,
                                                                            const __grid_constant__ MlaKvAppendParams a,
                                                                            int absorb_blocks) {
  extern __shared__ __align__(16) char smem[];
  const int b = int(blockIdx.x);
  if (b < absorb_blocks) {
    encore::device::PdlWait wait{false};
    mla_q_absorb_body(q, encore::device::TileRange{b, absorb_blocks}, smem, wait);
    encore::device::allow_downstream();
  } else {
    encore::device::PdlWait wait;
    mla_kv_append_body(a, encore::device::TileRange{b - absorb_blocks, int(gridDim.x) - absorb_blocks}, smem, wait);
  }
}

__global__ void __launch_bounds__(kBlockThreads) mla_combine_kernel(const __grid_constant__ MlaAttentionParams p) {
  extern __shared__ __align__(16) char smem[];
  encore::device::PdlWait wait{false};
  mla_combine_body(p, encore::device::GridRange{}, smem, wait);
  encore::device::allow_downstream();
}

template <int kTok>
__global__ void __launch_bounds__(kBlockThreads) mla_v_up_kernel(const __grid_constant__ MlaVUpParams p) {
  encore::device::PdlWait wait{false};
  mla_v_up_body<kTok>(p, encore::device::GridRange{}, wait);
  encore::device::allow_downstream();
}

int grid_for(int tiles, int per_sm) { return std::max(1, std::min(tiles, detail::sm_count() * per_sm)); }

}  // namespace

int mla_num_parts(int num_heads) {
  return std::max(detail::sm_count() / std::max(head_groups<SplitKvConfig>(num_heads), 1), 1);
}

Status mla_sched(const MlaSchedParams& p, cudaStream_t stream) {
  ENCORE_RETURN_IF_ERROR(mla_validate(p));
  ENCORE_RETURN_IF_ERROR(detail::check_stream(stream));
  return detail::launch(mla_sched_kernel, 1, mla_sched_smem_bytes(p.batch), stream, true, "mla_sched_kernel", p);
}

Status mla_kv_append(const MlaKvAppendParams& p, cudaStream_t stream) {
  ENCORE_RETURN_IF_ERROR(mla_validate(p));
  ENCORE_RETURN_IF_ERROR(detail::check_stream(stream));
  return detail::launch(mla_kv_append_kernel, grid_for(p.batch, 8), mla_kv_append_smem_bytes(), stream, true, "mla_kv_append_kernel", p);
}

int mla_q_absorb_num_tiles(const MlaQAbsorbParams& p) { return p.num_heads * QAbsorbConfig::kGroups; }

Status mla_q_absorb(const MlaQAbsorbParams& p, cudaStream_t stream) {
  ENCORE_RETURN_IF_ERROR(mla_validate(p));
  ENCORE_RETURN_IF_ERROR(detail::check_stream(stream));
  return detail::launch(mla_q_absorb_kernel, grid_for(mla_q_absorb_num_tiles(p), 4), mla_q_absorb_smem_bytes(), stream, true,
                        "mla_q_absorb_kernel", p);
}

Status mla_q_absorb_and_append(const MlaQAbsorbParams& q, const MlaKvAppendParams& a, cudaStream_t stream) {
  ENCORE_RETURN_IF_ERROR(mla_validate(q, a));
  ENCORE_RETURN_IF_ERROR(detail::check_stream(stream));
  const int absorb_blocks = grid_for(mla_q_absorb_num_tiles(q), 4), append_blocks = grid_for(a.batch, 8);
  return detail::launch(mla_q_absorb_append_kernel, absorb_blocks + append_blocks,
                        std::max(mla_q_absorb_smem_bytes(), mla_kv_append_smem_bytes()), stream, true, "mla_q_absorb_append_kernel", q,
                        a, absorb_blocks);
}

int mla_combine_num_tiles(const MlaAttentionParams& p) { return p.batch * p.num_heads * CombineConfig::slices(p.batch); }

Status mla_combine(const MlaAttentionParams& p, cudaStream_t stream) {
  ENCORE_RETURN_IF_ERROR(mla_validate(p));
  ENCORE_RETURN_IF_ERROR(detail::check_stream(stream));
  return detail::launch(mla_combine_kernel, grid_for(mla_combine_num_tiles(p), 8), mla_combine_smem_bytes(p.num_parts), stream,
                        true, "mla_combine_kernel", p);
}

int mla_v_up_num_tiles(const MlaVUpParams& p) { return p.num_heads * VUpConfig::kGroups; }

Status mla_v_up(const MlaVUpParams& p, cudaStream_t stream) {
  ENCORE_RETURN_IF_ERROR(mla_validate(p));
  ENCORE_RETURN_IF_ERROR(detail::check_stream(stream));
  auto* kernel = p.batch == 1 ? mla_v_up_kernel<v_up_tokens_per_round(1)> : mla_v_up_kernel<v_up_tokens_per_round(2)>;
  return detail::launch(kernel, grid_for(mla_v_up_num_tiles(p), 4), 0, stream, true, "mla_v_up_kernel", p);
}

}  // namespace encore::ops
