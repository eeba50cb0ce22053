// Device body of the Q4_K GEMV family: one tile = 8 warps x R output rows (R = 1 or 4) of one or
// two matrices (gate/up share the activations) for all tokens of the step.
//
// Work split inside a warp: 4 groups of 8 lanes split K round robin (group g takes blocks g, g+4,
// ...) for all R rows of the warp; lane c of a group always reads qs chunk c, so a group streams
// whole 144-byte blocks, and each lane's activations (one shared-memory read per block and token)
// serve R rows. Row sums are fixed-order shuffle butterflies: the result does not depend on the
// grid, the tile order or the block that runs the tile.
//
// Activations are quantised to int8 (activation_q8.cuh) into shared memory, `chunk_blocks` K
// blocks at a time; when one chunk holds all of K, a block that runs several tiles keeps them.
// A round's weight loads are issued before the activation prologue, so the two latencies overlap.
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
  int rows_per_warp;          // R: 1 or 4 (the kernel instantiation must match)
  int chunk_blocks;           // K blocks quantised per shared-memory pass
};

inline constexpr int kMaxTokens = 16;

__host__ __device__ constexpr int rows_per_tile(int rows_per_warp) { return kWarpsPerBlock * rows_per_warp; }
__host__ __device__ inline std::int64_t num_tiles(const GemvTileParams& p) {
  return (p.n + rows_per_tile(p.rows_per_warp) - 1) / rows_per_tile(p.rows_per_warp);
}
// Shared memory: activations [ntok][chunk_blocks] | sum(x^2) per (token, block) | running sum
// per token | 1/rms per token.
__host__ __device__ constexpr std::size_t smem_bytes(int ntok, int chunk_blocks) {
  return std::size_t(ntok) * chunk_blocks * (kActBlockBytes + sizeof(float)) + 2 * kMaxTokens * sizeof(float);
}

struct GemvSmem {
  char* act;         // [ntok][chunk_blocks][kActBlockBytes]
  float* block_ss;   // [ntok][chunk_blocks]
  float* total_ss;   // [kMaxTokens]
  float* inv_rms;    // [kMaxTokens]
  __device__ GemvSmem(char* base, int ntok, int chunk_blocks)
      : act(base),
        block_ss(reinterpret_cast<float*>(base + std::size_t(ntok) * chunk_blocks * kActBlockBytes)),
        total_ss(block_ss + ntok * chunk_blocks),
        inv_rms(total_ss + kMaxTokens) {}
  __device__ const char* act_block(int token, int chunk_blocks, int j) const {
    return act + (std::size_t(token) * chunk_blocks + j) * kActBlockBytes;
  }
};

namespace detail {

// Quantises K blocks [kb0, kb0 + nbc) of every active token into shared memory, and (with a norm)
// each block's sum(x^2). A warp takes (token, block) tasks round robin, four tasks' loads in flight
// at once so the prologue costs about one L2 round trip per four tasks.
__device__ __forceinline__ void quantize_chunk(const GemvTileParams& p, int kb0, int nbc, const GemvSmem& s) {
  constexpr int kTasksInFlight = 4;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int tasks = p.batch * nbc;
  for (int base = warp; base < tasks; base += kWarpsPerBlock * kTasksInFlight) {
    float v[kTasksInFlight][8];
#pragma unroll
    for (int u = 0; u < kTasksInFlight; ++u) {
      const int task = base + u * kWarpsPerBlock;
      if (task >= tasks) break;
      const int t = task / nbc, j = task % nbc;
      const float4* src = reinterpret_cast<const float4*>(p.x + t * p.x_stride + std::int64_t(kb0 + j) * 256 + lane * 8);
      const float4 a = src[0], b = src[1];
      v[u][0] = a.x, v[u][1] = a.y, v[u][2] = a.z, v[u][3] = a.w, v[u][4] = b.x, v[u][5] = b.y, v[u][6] = b.z, v[u][7] = b.w;
    }
#pragma unroll
    for (int u = 0; u < kTasksInFlight; ++u) {
      const int task = base + u * kWarpsPerBlock;
      if (task >= tasks) break;
      const int t = task / nbc, j = task % nbc;
      if (p.gamma) {
        float ss = 0.f;
#pragma unroll
        for (int i = 0; i < 8; ++i) ss += v[u][i] * v[u][i];
#pragma unroll
        for (int offset = 16; offset > 0; offset >>= 1) ss += __shfl_xor_sync(0xFFFFFFFFu, ss, offset);
        if (lane == 0) s.block_ss[t * p.chunk_blocks + j] = ss;
        const float4* g = reinterpret_cast<const float4*>(p.gamma + std::int64_t(kb0 + j) * 256 + lane * 8);
        const float4 ga = __ldg(g), gb = __ldg(g + 1);
        v[u][0] *= ga.x, v[u][1] *= ga.y, v[u][2] *= ga.z, v[u][3] *= ga.w;
        v[u][4] *= gb.x, v[u][5] *= gb.y, v[u][6] *= gb.z, v[u][7] *= gb.w;
      }
      quantize_act_block(v[u], const_cast<char*>(s.act_block(t, p.chunk_blocks, j)));
    }
  }
}

// After a chunk's prologue (and a barrier): fold its per-block sums into each token's total, in
// block order. After the last chunk: 1/rms per token.
__device__ __forceinline__ void accumulate_rms(const GemvTileParams& p, int kb0, int nbc, const GemvSmem& s) {
  const int t = threadIdx.x;
  if (t >= p.batch) return;
  float total = kb0 == 0 ? 0.f : s.total_ss[t];
  for (int j = 0; j < nbc; ++j) total += s.block_ss[t * p.chunk_blocks + j];
  s.total_ss[t] = total;
  if (kb0 + nbc == p.k_blocks) s.inv_rms[t] = rsqrtf(total / float(p.k_blocks * 256) + p.eps);
}

}  // namespace detail

// Runs one tile. `act_cached` persists across the tiles a block runs: when all of K fits in one
// chunk, the activations (and 1/rms) quantised for the first tile serve the rest.
template <int NTOK, int NMAT, int R>
__device__ void gemv_tile(const GemvTileParams& p, std::int64_t tile, char* smem, bool& act_cached) {
  // Lane items per round: (block, row) pairs, block-major so one activation read feeds R rows.
  // Few enough that the single-token bodies fit two blocks per SM (the L2 lookahead, not the
  // registers, keeps the bytes in flight).
  constexpr int kItems = (NTOK * R * NMAT >= 32 || (NTOK == 1 && R == 4)) ? 4 : 8;
  constexpr int kBlocksPerRound = kItems / R;
  static_assert(kItems % R == 0, "a round covers whole blocks");
  const GemvSmem s(smem, NTOK, p.chunk_blocks);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int chunk = lane % 8, group = lane / 8;
  const std::int64_t row0 = tile * rows_per_tile(R) + warp * R;
  const bool single_chunk = p.chunk_blocks >= p.k_blocks;
  const bool quantize = !(single_chunk && act_cached);

  float acc[NMAT][R][NTOK];
#pragma unroll
  for (int m = 0; m < NMAT; ++m)
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int t = 0; t < NTOK; ++t) acc[m][r][t] = 0.f;

  LaneBlock w[kItems][NMAT];
  for (int kb0 = 0; kb0 < p.k_blocks; kb0 += p.chunk_blocks) {
    const int nbc = min(p.chunk_blocks, p.k_blocks - kb0);
    const int my_blocks = nbc > group ? (nbc - group + 3) / 4 : 0;  // blocks group, group+4, ...
    const int rounds = (my_blocks + kBlocksPerRound - 1) / kBlocksPerRound;
    auto load_round = [&](int round) {
#pragma unroll
      for (int u = 0; u < kItems; ++u) {
        const int jj = round * kBlocksPerRound + u / R;
        const std::int64_t row = row0 + u % R;
        if (jj < my_blocks && row < p.n) {
          const std::int64_t offset = row * p.row_bytes + std::int64_t(kb0 + group + 4 * jj) * q4k::kBlockBytes;
#pragma unroll
          for (int m = 0; m < NMAT; ++m) w[u][m] = load_lane_block(p.mat[m] + offset, chunk);
        }
      }
    };
    if (rounds > 0) load_round(0);  // in flight while the activations are prepared
    if (quantize) {
      __syncthreads();  // the previous chunk's readers are done
      detail::quantize_chunk(p, kb0, nbc, s);
      __syncthreads();
      if (p.gamma) {
        detail::accumulate_rms(p, kb0, nbc, s);
        __syncthreads();
      }
    }
    for (int round = 0; round < rounds; ++round) {
      if (round > 0) load_round(round);
#pragma unroll
      for (int b = 0; b < kBlocksPerRound; ++b) {
        const int jj = round * kBlocksPerRound + b;
        if (jj >= my_blocks) break;
        const int j = group + 4 * jj;
        LaneWeights lw[R][NMAT];
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
          for (int m = 0; m < NMAT; ++m) lw[r][m] = decode_lane_block(w[b * R + r][m], chunk);
#pragma unroll
        for (int t = 0; t < NTOK; ++t) {
          if (t >= p.batch) break;
          const LaneActivations a = load_lane_activations(act_block(s.act_block(t, p.chunk_blocks, j)), chunk);
#pragma unroll
          for (int r = 0; r < R; ++r)
#pragma unroll
            for (int m = 0; m < NMAT; ++m) acc[m][r][t] += lane_block_dot(lw[r][m], a);
        }
      }
    }
  }
  act_cached = single_chunk;

  // Row sums: the 8 lanes of a group, then the 4 groups (fixed butterfly order).
#pragma unroll
  for (int m = 0; m < NMAT; ++m)
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int t = 0; t < NTOK; ++t) {
        float v = acc[m][r][t];
#pragma unroll
        for (int offset = 1; offset < 32; offset <<= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, offset);
        acc[m][r][t] = v;
      }

  // Lane c of group r stores row r for tokens t = c, c + 8 (spreads the stores).
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const std::int64_t row = row0 + r;
    if (group != r % 4 || row >= p.n) continue;
#pragma unroll
    for (int t = 0; t < NTOK; ++t) {
      if (t >= p.batch) break;
      if (t % 8 != chunk) continue;
      const float scale = p.gamma ? s.inv_rms[t] : 1.f;
      const std::int64_t at = t * p.out_stride + row;
      const float g = acc[0][r][t] * scale;
      if (p.epilogue == Epilogue::kStore) {
        p.out[0][at] = p.residual ? g + p.residual[at] : g;
      } else {
        const float u = acc[NMAT - 1][r][t] * scale;
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
    const std::int64_t k = std::int64_t(p.k_blocks) * 256;
    for (int t = 0; t < p.batch; ++t)
      for (std::int64_t j = threadIdx.x; j < k; j += kBlockThreads)
        p.normalized[t * k + j] = p.x[t * p.x_stride + j] * s.inv_rms[t] * p.gamma[j];
  }
}

}  // namespace encore::gemv
