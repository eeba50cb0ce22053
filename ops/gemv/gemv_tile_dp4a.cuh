// The GEMV's dp4a core (1..4 tokens, and wherever the tensor-core cores do not fit): one tile =
// 8 warps x W rows, G row groups x 8 / G K slices per warp (gemv_tile.cuh).
#pragma once

#include <cstdint>

#include "common/body.cuh"
#include "gemv/gemv_activations.cuh"
#include "gemv/gemv_pipe.cuh"
#include "q4k/q4k_stream.cuh"

namespace encore::gemv {

// Runs one tile: the calling block's TileState must have been started for the sequence of tiles
// it runs, in that order. RL must equal p.rows_per_warp / p.row_groups. A wait policy with marks
// (the traced megakernel's) marks, for the block's item-th tile, when warp 0 has the tile's first
// weights (with how long it waited for them: the activations come before) and when its K loop ends.
template <int NTOK, int NMAT, int RL, class Wait>
__device__ void gemv_tile(const GemvTileParams& p, std::int64_t tile, const GemvSmem& s, TileState& state, Wait& wait, int item) {
  WeightPipe& pipe = state.pipe;
  const int G = p.row_groups, slices = 8 / G, W = p.rows_per_warp;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int group = lane / 4, quad = lane % 4;
  const int my_g = group % G, slice = group / G;
  const std::int64_t row0 = tile * rows_per_tile(W) + warp * W;
  const bool single_chunk = p.chunk_blocks >= p.k_blocks;
  const bool quantize = !(single_chunk && state.act_cached);
  const int pitch = q4k::slot_pitch(p.slot_blocks);
  const std::uint64_t policy = q4k::evict_first_policy();
  const q4k::PairUnpack unpack = q4k::pair_unpack(quad);
  // Rows of this group that exist: i < live (rows my_g + G * i, i < RL).
  const std::int64_t left = p.n - row0 - my_g;
  const int live = left <= 0 ? 0 : left >= std::int64_t(G) * (RL - 1) + 1 ? RL : int((left + G - 1) / G);

  // The outputs this lane stores at the end: the 32 / G lanes of a row take its tokens round robin.
  const int lanes_per_row = 32 / G, my_index = slice * 4 + quad;
  auto for_each_output = [&](auto&& f) {
#pragma unroll
    for (int i = 0; i < RL; ++i) {
      if (i >= live) break;
#pragma unroll
      for (int t = 0; t < NTOK; ++t) {
        if (t >= p.batch) break;
        if (t % lanes_per_row == my_index) f(i, row0 + my_g + G * i, t);
      }
    }
  };
  // The residual each of them adds: into L1 now, read after the K loop (a round trip at the tile's
  // end otherwise, on the kernel's last blocks).
  if (p.residual)
    for_each_output([&](int, std::int64_t row, int t) { device::prefetch_l1(p.residual + t * p.out_stride + row); });

  float acc[NMAT][RL][NTOK];
#pragma unroll
  for (int m = 0; m < NMAT; ++m)
#pragma unroll
    for (int i = 0; i < RL; ++i)
#pragma unroll
      for (int t = 0; t < NTOK; ++t) acc[m][i][t] = 0.f;

  for (int kb0 = 0; kb0 < p.k_blocks; kb0 += p.chunk_blocks) {
    const int nbc = min(p.chunk_blocks, p.k_blocks - kb0);
    if (quantize) detail::load_chunk<NTOK, false, kPrologueStaged<NTOK, NMAT, Core::kDp4a>>(p, kb0, nbc, s);
    for (int ks0 = kb0; ks0 < kb0 + nbc; ks0 += p.slot_blocks) {
      const int nb = min(p.slot_blocks, p.k_blocks - ks0);
      const std::uint64_t before = ks0 == 0 && device::marking(wait) ? device::global_ns() : 0;
      const char* slot_data = pipe.wait_next() + my_g * pitch;
      if (before) device::mark(wait, device::Mark::kItemWeights, item, std::uint32_t(device::global_ns() - before));
      // One row per group: a deeper unroll where the block's 8 warps alone must hide the loop's
      // latency (the same order, so the same sums); elsewhere other blocks do, and code costs.
#pragma unroll(RL > 1 ? 1 : Wait::kLatencyExposed ? 3 : 2)
      for (int jl = slice; jl < nb; jl += slices) {
        if (live == 0) break;
        q4k::QuadWeights w[NMAT][RL];
#pragma unroll
        for (int m = 0; m < NMAT; ++m)
#pragma unroll
          for (int i = 0; i < RL; ++i)
            if (i < live) w[m][i] = q4k::decode_quad(slot_data + (m * W + G * i) * pitch + jl * q4k::kBlockBytes, quad, unpack);
#pragma unroll
        for (int t = 0; t < NTOK; ++t) {
          if (t >= p.batch) break;
          const q4k::QuadActivations a = q4k::load_quad_activations(s.act_block(t, ks0 - kb0 + jl), quad);
#pragma unroll
          for (int m = 0; m < NMAT; ++m)
#pragma unroll
            for (int i = 0; i < RL; ++i)
              if (i < live) acc[m][i][t] += q4k::quad_dot(w[m][i], a);
        }
      }
      __syncwarp();  // every lane is done with the buffer before it is refilled
      pipe.release();
      detail::fill_next_slot<NMAT>(p, pipe, policy);
    }
  }
  state.act_cached = single_chunk;
  device::mark(wait, device::Mark::kItemComputed, item);

  // Row sums: the 4 lanes of a group, then the 8 / G groups of the row (fixed butterfly order).
#pragma unroll
  for (int m = 0; m < NMAT; ++m)
#pragma unroll
    for (int i = 0; i < RL; ++i)
#pragma unroll
      for (int t = 0; t < NTOK; ++t) {
        float v = acc[m][i][t];
        v += __shfl_xor_sync(0xFFFFFFFFu, v, 1);
        v += __shfl_xor_sync(0xFFFFFFFFu, v, 2);
        for (int offset = 4 * G; offset < 32; offset <<= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, offset);
        acc[m][i][t] = v;
      }

  for_each_output([&](int i, std::int64_t row, int t) { detail::store_output(p, s, row, t, acc[0][i][t], acc[NMAT - 1][i][t]); });
  detail::store_normalized(p, s, tile);
}

}  // namespace encore::gemv
