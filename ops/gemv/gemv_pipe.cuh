// The GEMV's per-warp weight rings (gemv_tile.cuh): bulk copies of each warp's rows, one mbarrier
// per ring buffer, running ahead across the tiles a block executes.
#pragma once

#include <cstdint>

#include "common/async_copy.cuh"
#include "gemv/gemv_params.cuh"

namespace encore::gemv {

// The per-warp weight ring. The producer cursor walks the same (tile, slot) sequence the block
// computes: tiles first_tile, first_tile + tile_stride, ... and ceil(k_blocks / slot_blocks)
// slots per tile. Values are warp-uniform.
struct WeightPipe {
  std::uint64_t* bars;
  char* ring;
  int slot_size;
  std::uint32_t consumed = 0, issued = 0;
  std::int64_t next_tile, tile_stride, tiles;
  int next_k_piece = 0;
};

// The state a block carries from one tile to the next.
struct TileState {
  WeightPipe pipe;
  bool act_cached = false;  // the activations of the previous tile are still in shared memory
};

namespace detail {

// Copies the producer's next slot into its ring buffer (nothing once the block's tiles are done).
// MMA: the mma core's pipe, where every warp streams its row group over its own K part.
template <int NMAT, bool MMA = false>
__device__ __forceinline__ void fill_next_slot(const GemvTileParams& p, WeightPipe& pipe, std::uint64_t policy) {
  if (pipe.next_tile >= pipe.tiles) return;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, R = p.rows_per_warp;
  const int k_begin = MMA ? mma_k_begin(p, warp) : 0, k_end = MMA ? mma_k_end(p, warp) : p.k_blocks;
  if (MMA && k_begin == k_end) return;
  const std::uint32_t slot = pipe.issued % std::uint32_t(p.slots);
  const int kb0 = k_begin + pipe.next_k_piece * p.slot_blocks;
  const int nb = min(p.slot_blocks, k_end - kb0);
  const std::int64_t row0 = MMA ? pipe.next_tile * tile_rows(p) + mma_row_group(p, warp) * kMmaTileRows
                                : pipe.next_tile * rows_per_tile(R) + warp * R;
  const std::int64_t left = p.n - row0;
  const int valid = left <= 0 ? 0 : left < R ? int(left) : R;
  const std::uint32_t bytes = std::uint32_t(nb) * q4k::kBlockBytes;
  if (lane == 0) device::barrier_arrive_expect(&pipe.bars[slot], std::uint32_t(NMAT * valid) * bytes);
  for (int c = lane; c < NMAT * R; c += 32) {
    const int m = c / R, r = c % R;
    if (r < valid)
      device::bulk_copy_to_shared(pipe.ring + slot * pipe.slot_size + c * q4k::slot_pitch(p.slot_blocks),
                                  p.mat[m] + (row0 + r) * p.row_bytes + std::int64_t(kb0) * q4k::kBlockBytes, bytes,
                                  &pipe.bars[slot], policy);
  }
  ++pipe.issued;
  if (k_begin + ++pipe.next_k_piece * p.slot_blocks >= k_end) {
    pipe.next_k_piece = 0;
    pipe.next_tile += pipe.tile_stride;
  }
}

}  // namespace detail

// Sets up the calling warp's ring (barriers, first `slots` copies) for tiles first_tile,
// first_tile + tile_stride, ... < tiles. Reads only weights: may run before the PDL wait.
template <int NMAT, bool MMA = false>
__device__ WeightPipe start_weight_pipe(const GemvTileParams& p, const GemvSmem& s, std::int64_t first_tile,
                                        std::int64_t tile_stride) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  WeightPipe pipe;
  pipe.bars = s.bars + warp * p.slots;
  pipe.ring = s.ring + std::size_t(warp) * s.ring_bytes_per_warp;
  pipe.slot_size = s.slot_size;
  pipe.next_tile = first_tile;
  pipe.tile_stride = tile_stride;
  pipe.tiles = num_tiles(p);
  if (lane == 0) {
    for (int i = 0; i < p.slots; ++i) device::barrier_init(&pipe.bars[i], 1);
    device::fence_barrier_init();
  }
  __syncwarp();
  const std::uint64_t policy = q4k::evict_first_policy();
  for (int i = 0; i < p.slots; ++i) detail::fill_next_slot<NMAT, MMA>(p, pipe, policy);
  return pipe;
}

}  // namespace encore::gemv
