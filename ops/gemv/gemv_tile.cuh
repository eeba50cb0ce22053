// Device body of the Q4_K GEMV family: one tile = 8 warps x `rows_per_warp` output rows of one
// or two matrices (gate/up share the activations) for all tokens of the step.
//
// Work split inside a warp: 4 groups of 8 lanes. With rows_per_warp = r, each row is shared by
// 4/r groups that take its K blocks round robin; lane c of a group always reads qs chunk c, so a
// group streams whole 144-byte blocks. Row sums are fixed-order shuffle butterflies: the result
// does not depend on the grid, the tile order or the block that runs the tile.
//
// Activations are quantised to int8 (activation_q8.cuh) into shared memory, `chunk_blocks` K
// blocks at a time; when one chunk holds all of K, a block that runs several tiles keeps them.
#pragma once

#include <cstdint>

#include "common/launch.cuh"
#include "gemv/activation_q8.cuh"
#include "gemv/q4k_dot.cuh"

namespace encore::gemv {

enum class Epilogue : int {
  kStore,    // out0 = acc (+ residual)
  kSiluMul,  // out0 = silu(acc_gate) * acc_up
  kRaw,      // out0 = acc_gate, out1 = acc_up
};

// Device-ready arguments of one GEMV stage (built and validated by the host launchers).
struct GemvTileParams {
  const char* mat[2];         // Q4_K matrices [n][k_blocks] (mat[1] only for gate/up)
  std::int64_t row_bytes;     // k_blocks * 144
  const float* x;             // [batch][x_stride]
  std::int64_t x_stride;
  const float* gamma;         // [k] RMSNorm weight, or null (no norm)
  float eps;
  float* out[2];              // [batch][out_stride]
  std::int64_t out_stride;
  const float* residual;      // optional [batch][out_stride]
  float* normalized;          // optional [batch][k], written by tile 0
  Epilogue epilogue;
  std::int64_t n;             // rows
  int k_blocks;               // k / 256
  int batch;                  // active tokens (<= NTOK of the instantiation)
  int rows_per_warp;          // 1, 2 or 4
  int chunk_blocks;           // K blocks quantised per shared-memory pass
};

inline constexpr int kScratchFloats = kWarpsPerBlock * 16 + 16;  // per-warp partial sums + 1/rms

__host__ __device__ constexpr int rows_per_tile(int rows_per_warp) { return kWarpsPerBlock * rows_per_warp; }
__host__ __device__ inline std::int64_t num_tiles(const GemvTileParams& p) {
  return (p.n + rows_per_tile(p.rows_per_warp) - 1) / rows_per_tile(p.rows_per_warp);
}
__host__ __device__ constexpr std::size_t smem_bytes(int ntok, int chunk_blocks) {
  return std::size_t(ntok) * chunk_blocks * kActBlockBytes + kScratchFloats * sizeof(float);
}

namespace detail {

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, offset);
  return v;
}

// Quantises K blocks [kb0, kb0 + nbc) of every token into shared memory; adds each thread's share
// of sum(x^2) per token to `sumsq`.
template <int NTOK>
__device__ void quantize_chunk(const GemvTileParams& p, int kb0, int nbc, char* act, float (&sumsq)[NTOK]) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int t = 0; t < NTOK; ++t) {
    if (t >= p.batch) break;
    for (int j = warp; j < nbc; j += kWarpsPerBlock) {
      const std::int64_t col = std::int64_t(kb0 + j) * 256 + lane * 8;
      const float4* src = reinterpret_cast<const float4*>(p.x + t * p.x_stride + col);
      const float4 a = src[0], b = src[1];
      float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
      for (int i = 0; i < 8; ++i) sumsq[t] += v[i] * v[i];
      if (p.gamma) {
        const float4* g = reinterpret_cast<const float4*>(p.gamma + col);
        const float4 ga = __ldg(g), gb = __ldg(g + 1);
        const float gv[8] = {ga.x, ga.y, ga.z, ga.w, gb.x, gb.y, gb.z, gb.w};
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] *= gv[i];
      }
      quantize_act_block(v, act + (std::size_t(t) * p.chunk_blocks + j) * kActBlockBytes);
    }
  }
}

// 1/rms per token from the threads' partial sums (fixed order: lanes, then warps 0..7).
template <int NTOK>
__device__ void finish_rms(const GemvTileParams& p, const float (&sumsq)[NTOK], float* scratch) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
#pragma unroll
  for (int t = 0; t < NTOK; ++t) {
    const float s = warp_sum(sumsq[t]);
    if (lane == 0) scratch[warp * 16 + t] = s;
  }
  __syncthreads();
  if (threadIdx.x < NTOK) {
    float s = 0.f;
    for (int w = 0; w < kWarpsPerBlock; ++w) s += scratch[w * 16 + threadIdx.x];
    scratch[kWarpsPerBlock * 16 + threadIdx.x] = rsqrtf(s / float(p.k_blocks * 256) + p.eps);
  }
  __syncthreads();
}

}  // namespace detail

// Runs one tile. `act_cached` persists across the tiles a block runs: when all of K fits in one
// chunk, the activations (and 1/rms) quantised for the first tile serve the rest.
template <int NTOK, int NMAT>
__device__ void gemv_tile(const GemvTileParams& p, std::int64_t tile, char* smem, bool& act_cached) {
  constexpr int kUnroll = NMAT == 1 ? 8 : 4;  // independent 16-byte loads in flight per lane
  char* act = smem;
  float* scratch = reinterpret_cast<float*>(smem + std::size_t(NTOK) * p.chunk_blocks * kActBlockBytes);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int chunk = lane % 8, group = lane / 8;
  const int groups_per_row = 4 / p.rows_per_warp;
  const std::int64_t row = tile * rows_per_tile(p.rows_per_warp) + warp * p.rows_per_warp + group / groups_per_row;
  const int part = group % groups_per_row;
  const bool row_valid = row < p.n;
  const bool single_chunk = p.chunk_blocks >= p.k_blocks;
  const bool quantize = !(single_chunk && act_cached);

  float acc[NMAT][NTOK];
#pragma unroll
  for (int m = 0; m < NMAT; ++m)
#pragma unroll
    for (int t = 0; t < NTOK; ++t) acc[m][t] = 0.f;
  float sumsq[NTOK];
#pragma unroll
  for (int t = 0; t < NTOK; ++t) sumsq[t] = 0.f;

  for (int kb0 = 0; kb0 < p.k_blocks; kb0 += p.chunk_blocks) {
    const int nbc = min(p.chunk_blocks, p.k_blocks - kb0);
    if (quantize) {
      __syncthreads();  // the previous chunk's readers are done
      detail::quantize_chunk<NTOK>(p, kb0, nbc, act, sumsq);
      __syncthreads();
    }
    if (!row_valid) continue;
    const char* w[NMAT];
#pragma unroll
    for (int m = 0; m < NMAT; ++m) w[m] = p.mat[m] + row * p.row_bytes + std::int64_t(kb0) * q4k::kBlockBytes;

    for (int j0 = part; j0 < nbc; j0 += groups_per_row * kUnroll) {
      LaneBlock blocks[kUnroll][NMAT];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int j = j0 + u * groups_per_row;
        if (j < nbc)
#pragma unroll
          for (int m = 0; m < NMAT; ++m) blocks[u][m] = load_lane_block(w[m] + j * q4k::kBlockBytes, chunk);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int j = j0 + u * groups_per_row;
        if (j >= nbc) break;
#pragma unroll
        for (int m = 0; m < NMAT; ++m) {
          const LaneWeights lw = decode_lane_block(blocks[u][m], chunk);
#pragma unroll
          for (int t = 0; t < NTOK; ++t) {
            if (t >= p.batch) break;
            acc[m][t] += lane_block_dot(lw, chunk, act_block(act + (std::size_t(t) * p.chunk_blocks + j) * kActBlockBytes));
          }
        }
      }
    }
  }
  if (quantize && p.gamma) detail::finish_rms<NTOK>(p, sumsq, scratch);
  act_cached = single_chunk;

  // Row sums: 8 lanes of a group, then the groups sharing the row.
#pragma unroll
  for (int m = 0; m < NMAT; ++m)
#pragma unroll
    for (int t = 0; t < NTOK; ++t) {
      float v = acc[m][t];
      v += __shfl_xor_sync(0xFFFFFFFFu, v, 1);
      v += __shfl_xor_sync(0xFFFFFFFFu, v, 2);
      v += __shfl_xor_sync(0xFFFFFFFFu, v, 4);
      if (groups_per_row >= 2) v += __shfl_xor_sync(0xFFFFFFFFu, v, 8);
      if (groups_per_row == 4) v += __shfl_xor_sync(0xFFFFFFFFu, v, 16);
      acc[m][t] = v;
    }

  if (row_valid && part == 0) {
    const float* inv_rms = scratch + kWarpsPerBlock * 16;
#pragma unroll
    for (int t = 0; t < NTOK; ++t) {
      if (t >= p.batch) break;
      if (t % 8 != chunk) continue;  // spread the token stores over the group's lanes
      const float scale = p.gamma ? inv_rms[t] : 1.f;
      const std::int64_t at = t * p.out_stride + row;
      const float g = acc[0][t] * scale;
      if (p.epilogue == Epilogue::kStore) {
        p.out[0][at] = p.residual ? g + p.residual[at] : g;
      } else {
        const float u = acc[NMAT - 1][t] * scale;
        if (p.epilogue == Epilogue::kSiluMul) {
          p.out[0][at] = g / (1.f + expf(-g)) * u;
        } else {
          p.out[0][at] = g;
          p.out[1][at] = u;
        }
      }
    }
  }

  if (p.normalized && tile == 0) {
    const float* inv_rms = scratch + kWarpsPerBlock * 16;
    const std::int64_t k = std::int64_t(p.k_blocks) * 256;
    for (int t = 0; t < p.batch; ++t)
      for (std::int64_t j = threadIdx.x; j < k; j += kBlockThreads)
        p.normalized[t * k + j] = p.x[t * p.x_stride + j] * inv_rms[t] * p.gamma[j];
  }
}

}  // namespace encore::gemv
