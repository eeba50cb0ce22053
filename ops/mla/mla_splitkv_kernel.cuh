// The split-KV kernel: each block walks (scheduler part, head group) tiles. A template over the
// body's variant, so the benchmark runs the loads-only / math-only variants through the very
// kernel the op launches. kFusedCombine = true is
// mla_attention's one-kernel path: it must be launched with one block per tile, all co-resident
// (mla_attention checks tiles <= SMs; one ~202 KB block fits per SM).
#pragma once

#include <encore/ops/mla.h>

#include "common/launch.cuh"
#include "mla/mla_splitkv_tile.cuh"

namespace encore::ops::mla {

template <SplitKvVariant kVariant = SplitKvVariant::kOp, bool kFusedCombine = false>
__global__ void __launch_bounds__(kBlockThreads, 1) mla_splitkv_kernel(const __grid_constant__ SplitKvArgs args) {
  extern __shared__ __align__(1024) char smem[];  // (the body aligns it itself too)
  const MlaAttentionParams& p = args.p;
  detail_splitkv::PageStages stages = detail_splitkv::page_stages_init(&args.pages, smem);
  if (!p.plan_settled) encore::device::wait_for_upstream();  // else each tile waits after starting its first pages
  encore::device::allow_downstream();  // the combine's own wait still covers all of this grid
  const int tiles = p.num_parts * head_groups(p.num_heads);
  for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    mla_splitkv_tile<kVariant, kFusedCombine>(p, tile, smem, stages);
    encore::device::fence_proxy_async();  // this tile's generic writes to the stages, before the next tile's copies
    __syncthreads();
  }
}

}  // namespace encore::ops::mla
