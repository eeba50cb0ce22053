// The split-KV kernel: each block walks (scheduler part, head group) tiles. A template over the
// body's variant, so the benchmark runs the loads-only / math-only variants through the very
// kernel the op launches, and over the tile's shape (Cfg: the op's, or the one for half an SM that
// the megakernel runs at two blocks per SM). kFusedCombine = true is mla_attention's one-kernel
// path: it must be launched with one block per tile, all co-resident (mla_attention checks tiles
// <= SMs; one ~207 KB block fits per SM).
#pragma once

#include <encore/ops/mla.h>

#include "common/block.h"
#include "common/pdl.cuh"
#include "mla/mla_splitkv_tile.cuh"

namespace encore::mla {

template <SplitKvVariant kVariant = SplitKvVariant::kOp, bool kFusedCombine = false, class Cfg = SplitKvConfig>
__global__ void __launch_bounds__(kBlockThreads, Cfg::kBlocksPerSm) mla_splitkv_kernel(const __grid_constant__ SplitKvArgs args) {
  extern __shared__ __align__(1024) char smem[];  // (the body aligns it itself too)
  const MlaAttentionParams& p = args.p;
  // The combine's own wait still covers all of this grid. Settled plan: dependents start now and
  // each tile waits after starting its first pages; else the body waits first, then releases them.
  if (p.plan_settled) encore::device::allow_downstream();
  encore::device::PdlWait wait{!p.plan_settled};
  mla_splitkv_body<kVariant, kFusedCombine, Cfg>(p, &args.pages, encore::device::GridRange{}, smem, wait);
}

}  // namespace encore::mla
