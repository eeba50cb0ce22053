// Device body of the Q4_K GEMV family: one tile = 8 warps x W output rows of one or two matrices
// (gate/up share the activations) for all tokens of the step.
//
// Weights: each warp streams its W rows through its own ring of `slots` shared-memory
// buffers, one bulk copy per (matrix, row) and slot of `slot_blocks` K blocks (one per matrix
// where a slot of whole rows lies as in global memory), completion on one mbarrier per buffer.
// The ring runs ahead across the tiles a block executes (WeightPipe), so the first slots of the
// next tile are in flight while this one computes; bytes in flight cost no registers. The copies
// of a block's first slots are issued before the PDL wait.
//
// Math: the 8 four-lane groups of a warp are G row groups x (8 / G) K slices; group g owns the
// RL = W / G rows g % G + G * i (i < RL) and the slot's blocks g / G, g / G + 8 / G, ... Lane p
// of a group reads 64 weights per block and row (q4k_stream.cuh): one scale/min decode per 64
// weights, each activation load serves RL rows (RL > 1 for several tokens).
// Row sums are fixed-order shuffle butterflies: the result never depends on the grid or the block
// that runs a tile.
//
// Activations are quantised to int8 (activation_q8.cuh) into shared memory, `chunk_blocks` K
// blocks at a time; when one chunk holds all of K, a block that runs several tiles keeps them.
//
// From 5 tokens the launcher picks the int8 tensor-core body instead (gemv_tile_mma, q4k_mma.cuh):
// the same weight rings and activations, one mma.sync.m16n8k32 per sub-block and 8 tokens. The
// fp16 tensor-core body (gemv_tile_mma_f16, q4k_mma_f16.cuh; GemvCore::kMmaF16) shares its row
// groups and rings but quantises the activations to scaled fp16 (activation_f16.cuh) and applies
// the scales once per block instead of once per sub-block.
//
// Files: gemv_params.cuh (params, geometry, shared memory), gemv_pipe.cuh (weight rings),
// gemv_activations.cuh (activation chunks, stores), gemv_tile_dp4a.cuh, gemv_tile_mma.cuh (cores).
#pragma once

#include <cstdint>

#include "common/body.cuh"
#include "gemv/gemv_params.cuh"
#include "gemv/gemv_pipe.cuh"
#include "gemv/gemv_tile_dp4a.cuh"
#include "gemv/gemv_tile_mma.cuh"

namespace encore::gemv {

// The GEMV body (common/body.cuh): every warp's weight ring starts on the block's tiles (weights
// only), then the wait, the tiles, and (when another body follows) the ring's barriers are
// invalidated: every copy the ring issued was consumed. C: the core, whose plan p must be (the
// tensor-core cores take NTOK >= 8; core_of(p)).
template <int NTOK, int NMAT, Core C, class Range, class Wait>
__device__ void gemv_body(const GemvTileParams& p, const Range& r, char* smem, Wait& wait) {
  constexpr bool kMma = C != Core::kDp4a;
  const GemvSmem s(smem, p, NTOK, NMAT, C == Core::kMmaF16);
  const std::int64_t tiles = num_tiles(p);
  TileState state;
  state.pipe = start_weight_pipe<NMAT, kMma>(p, s, r.first(), r.stride());
  // The norm's gamma is read with the activations right after the wait: into L2 under it.
  if (p.gamma && threadIdx.x == 0) device::prefetch_l2(p.gamma, std::uint32_t(p.k_blocks) * 256 * sizeof(float));
  wait();
  int item = 0;  // (trace mode: the block's tiles, counted)
  for (std::int64_t tile = r.first(); tile < tiles; tile += r.stride(), ++item) {
    device::mark(wait, device::Mark::kItemBegin, item);
    if constexpr (C == Core::kMmaF16)
      gemv_tile_mma_f16<NTOK, NMAT>(p, tile, s, state);
    else if constexpr (C == Core::kMmaS8)
      gemv_tile_mma<NTOK, NMAT>(p, tile, s, state);
    else
      gemv_tile<NTOK, NMAT, rows_per_group(NTOK, NMAT)>(p, tile, s, state, wait, item);
    device::mark(wait, device::Mark::kItemEnd, item);  // (warp 0's end of the tile)
  }
  if constexpr (Wait::kSharedMemoryReused) {
    __syncwarp();
    if (threadIdx.x % 32 == 0) device::barrier_inval(state.pipe.bars, p.slots);
  }
}

}  // namespace encore::gemv
