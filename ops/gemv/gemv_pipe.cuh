// The GEMV's per-warp weight rings (gemv_tile.cuh): bulk copies of each warp's rows, one mbarrier
// per ring buffer, running ahead across the tiles a block executes.
#pragma once

#include <cstdint>

#include "common/async_copy.cuh"
#include "gemv/gemv_params.cuh"

namespace encore::gemv {

// The per-warp weight ring. The producer cursor walks the same (tile, slot) sequence the block
// computes: tiles first_tile, first_tile + tile_stride, ... and ceil(k blocks / slot_blocks)
// slots per tile, over the warp's K range. Values are warp-uniform. Buffer indices and phases
// advance by counting, and the producer keeps its next rows and K block, so a slot costs no
// integer division (the mma cores' slots are short: the ring's bookkeeping is on their path).
struct WeightPipe {
  std::uint64_t* bars;
  char* ring;
  int slot_size, slots;
  int use_slot = 0;             // the buffer the warp computes on next
  std::uint32_t use_phase = 0;  // and its phase parity
  int fill_slot = 0;            // the buffer the producer fills next
  int fill_kb = 0;              // the K block its copy starts at
  int k_begin = 0, k_end = 0;   // the warp's K range
  std::int64_t fill_tile_row;   // first row of the tile it fills (tile * tile_rows)
  std::int64_t tile_row_step;   // tile_stride * tile_rows
  std::int64_t rows_end;        // tiles * tile_rows: the producer stops there
  int warp_row;                 // the warp's first row within a tile

  // The buffer to compute on next, once its copies have landed.
  __device__ __forceinline__ const char* wait_next() {
    device::barrier_wait(&bars[use_slot], use_phase);
    return ring + use_slot * slot_size;
  }
  // The computed buffer is free (every lane is past its reads).
  __device__ __forceinline__ void release() {
    if (++use_slot == slots) use_slot = 0, use_phase ^= 1u;
  }
};

// The state a block carries from one tile to the next.
struct TileState {
  WeightPipe pipe;
  bool act_cached = false;  // the activations of the previous tile are still in shared memory
};

namespace detail {

// Copies the producer's next slot into its ring buffer (nothing once the block's tiles are done):
// lane r copies row r of each matrix (rows_per_warp <= 32).
template <int NMAT>
__device__ __forceinline__ void fill_next_slot(const GemvTileParams& p, WeightPipe& pipe, std::uint64_t policy) {
  if (pipe.fill_tile_row >= pipe.rows_end || pipe.k_begin == pipe.k_end) return;
  const int lane = threadIdx.x % 32, R = p.rows_per_warp;
  const int nb = min(p.slot_blocks, pipe.k_end - pipe.fill_kb);
  const std::int64_t row0 = pipe.fill_tile_row + pipe.warp_row, left = p.n - row0;
  const int valid = left <= 0 ? 0 : left < R ? int(left) : R;
  const std::uint32_t bytes = std::uint32_t(nb) * q4k::kBlockBytes;
  std::uint64_t* bar = &pipe.bars[pipe.fill_slot];
  if (lane == 0) device::barrier_arrive_expect(bar, std::uint32_t(NMAT * valid) * bytes);
  if (q4k::slot_pitch(p.slot_blocks) == p.row_bytes) {
    // A slot of all of K (its pitch can equal a row's bytes no other way) lies as in global
    // memory: one copy per matrix.
    char* dst = pipe.ring + pipe.fill_slot * pipe.slot_size;
    if (lane == 0 && valid > 0)
#pragma unroll
      for (int m = 0; m < NMAT; ++m)
        device::bulk_copy_to_shared(dst + m * R * p.row_bytes, p.mat[m] + row0 * p.row_bytes, std::uint32_t(valid) * bytes, bar,
                                    policy);
  } else if (lane < valid) {
    char* dst = pipe.ring + pipe.fill_slot * pipe.slot_size + lane * q4k::slot_pitch(p.slot_blocks);
    const std::int64_t src = (row0 + lane) * p.row_bytes + std::int64_t(pipe.fill_kb) * q4k::kBlockBytes;
#pragma unroll
    for (int m = 0; m < NMAT; ++m)
      device::bulk_copy_to_shared(dst + m * R * q4k::slot_pitch(p.slot_blocks), p.mat[m] + src, bytes, bar, policy);
  }
  if (++pipe.fill_slot == pipe.slots) pipe.fill_slot = 0;
  pipe.fill_kb += p.slot_blocks;
  if (pipe.fill_kb >= pipe.k_end) {
    pipe.fill_kb = pipe.k_begin;
    pipe.fill_tile_row += pipe.tile_row_step;
  }
}

}  // namespace detail

// Sets up the calling warp's ring (barriers, first `slots` copies) for tiles first_tile,
// first_tile + tile_stride, ... < tiles. Reads only weights: may run before the PDL wait.
// MMA: the mma cores' pipe, where every warp streams its row group over its own K part.
template <int NMAT, bool MMA = false>
__device__ WeightPipe start_weight_pipe(const GemvTileParams& p, const GemvSmem& s, std::int64_t first_tile,
                                        std::int64_t tile_stride) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  WeightPipe pipe;
  pipe.bars = s.bars + warp * p.slots;
  pipe.ring = s.ring + std::size_t(warp) * s.ring_bytes_per_warp;
  pipe.slot_size = s.slot_size;
  pipe.slots = p.slots;
  pipe.k_begin = MMA ? mma_k_begin(p, warp) : 0;
  pipe.k_end = MMA ? mma_k_end(p, warp) : p.k_blocks;
  pipe.fill_kb = pipe.k_begin;
  const std::int64_t rows = tile_rows(p);
  pipe.fill_tile_row = first_tile * rows;
  pipe.tile_row_step = tile_stride * rows;
  pipe.rows_end = num_tiles(p) * rows;
  pipe.warp_row = MMA ? mma_row_group(p, warp) * kMmaTileRows : warp * p.rows_per_warp;
  if (lane == 0) {
    for (int i = 0; i < p.slots; ++i) device::barrier_init(&pipe.bars[i], 1);
    device::fence_barrier_init();
  }
  __syncwarp();
  const std::uint64_t policy = q4k::evict_first_policy();
  for (int i = 0; i < p.slots; ++i) detail::fill_next_slot<NMAT>(p, pipe, policy);
  return pipe;
}

}  // namespace encore::gemv
