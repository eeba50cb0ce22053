// The GEMV's activations and outputs, shared by its cores: quantising chunks of x (int8 or
// fp16, with the RMSNorm's sums) into shared memory, and the epilogue's stores.
#pragma once

#include <cstdint>

#include "common/async_copy.cuh"
#include "common/block.h"
#include "common/warp.cuh"
#include "gemv/gemv_params.cuh"

namespace encore::gemv {

namespace detail {

// This lane's part of a task's sum of squares (its 8 values in order).
__device__ __forceinline__ float lane_sum_squares(const float (&v)[8]) {
  float ss = 0.f;
#pragma unroll
  for (int i = 0; i < 8; ++i) ss += v[i] * v[i];
  return ss;
}

// One (token t, block j) task's sum of squares for the norm (lane 0 stores it), from x.
__device__ __forceinline__ void store_block_ss(const GemvTileParams& p, const GemvSmem& s, int t, int j, const float (&v)[8]) {
  const float ss = device::warp_sum(lane_sum_squares(v));
  if (threadIdx.x % 32 == 0) s.block_ss[t * p.chunk_blocks + j] = ss;
}

// The task's values (x, or x * gamma) quantised into shared memory. F16: the fp16 core's format.
template <bool F16>
__device__ __forceinline__ void quantize_task(const GemvSmem& s, int t, int j, float (&v)[8]) {
  if constexpr (F16)
    q4k::quantize_act_block_f16(v, s.f16_values(t, j), s.f16_sums_of(t, j), s.f16_scale_of(t, j));
  else
    q4k::quantize_act_block(v, s.act_block(t, j));
}

// N tasks' values v[u] quantised at once (quantize_act_blocks: each step for all N before the
// next, so their shuffle chains overlap); live[u] false skips task u (warp-uniform).
template <bool F16, int N>
__device__ __forceinline__ void quantize_tasks(const GemvSmem& s, const int (&t)[N], const int (&j)[N], const bool (&live)[N],
                                               const float (&v)[N][8]) {
  if constexpr (F16) {
    char* values[N];
    char* sums[N];
    float* scales[N];
#pragma unroll
    for (int u = 0; u < N; ++u) values[u] = s.f16_values(t[u], j[u]), sums[u] = s.f16_sums_of(t[u], j[u]), scales[u] = s.f16_scale_of(t[u], j[u]);
    q4k::quantize_act_blocks_f16<N>(v, live, values, sums, scales);
  } else {
    char* out[N];
#pragma unroll
    for (int u = 0; u < N; ++u) out[u] = s.act_block(t[u], j[u]);
    q4k::quantize_act_blocks<N>(v, live, out);
  }
}

// Quantises K blocks [kb0, kb0 + nbc) of every active token into shared memory, and (with a norm)
// each block's sum(x^2), scaling x by gamma. A warp takes (token, block) tasks round robin,
// kInFlight tasks' loads in flight at once, so the prologue costs about one L2 round trip per
// kInFlight tasks (the body pulls gamma into L2 before its wait).
// - One token (a warp has one or two tasks; the first tile of a norm GEMV is on the step's critical
//   path): two tasks in flight, gamma loaded with x, and a task is its block (no division).
// - More tokens, kStaged (where the registers are not bounded for two blocks per SM): four tasks
//   in flight, each step of their chains (sums of squares, gamma's loads, the quantiser's
//   shuffles) for all four before the next, so the chains overlap and gamma costs one L2 round
//   trip per four tasks; one division a round.
// - Else four tasks in flight, gamma per task after its sum (with x, or staged, it held 32 more
//   registers and spilled inside the cores' loops; block-major shares, each block's gamma loaded
//   once per warp, measured slower at 16 tokens).
template <int NTOK, bool F16, bool kStaged>
__device__ __forceinline__ void quantize_chunk(const GemvTileParams& p, int kb0, int nbc, const GemvSmem& s,
                                               int warp = int(threadIdx.x / 32), int warps = kWarpsPerBlock) {
  const int lane = threadIdx.x % 32;
  const int tasks = p.batch * nbc;
  auto x_of = [&](int t, int j) { return p.x + t * p.x_stride + std::int64_t(kb0 + j) * 256 + lane * 8; };
  auto gamma_of = [&](int j) { return p.gamma + std::int64_t(kb0 + j) * 256 + lane * 8; };
#if ENCORE_EXP_PROLOGUE == 1  // a probe (docs/q4k.md §9.4): the multi-token GEMVs' time without their prologue; wrong outputs
  if constexpr (NTOK > 1) return;
#endif
  if constexpr (NTOK == 1) {
    constexpr int kInFlight = 2;
    for (int base = warp; base < tasks; base += warps * kInFlight) {
      float v[kInFlight][8], gamma[kInFlight][8];
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        const int j = base + u * warps;  // (token 0)
        if (j >= tasks) break;
        device::load_float8(x_of(0, j), v[u]);
        if (p.gamma) device::ldg_float8(gamma_of(j), gamma[u]);
      }
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        const int j = base + u * warps;
        if (j >= tasks) break;
        if (p.gamma) {
          store_block_ss(p, s, 0, j, v[u]);
#pragma unroll
          for (int i = 0; i < 8; ++i) v[u][i] *= gamma[u][i];
        }
        quantize_task<F16>(s, 0, j, v[u]);
      }
    }
  } else if constexpr (kStaged) {
    constexpr int kInFlight = 4;
    for (int base = warp; base < tasks; base += warps * kInFlight) {
      // Task base + u * warps is (token t[u], block j[u]).
      int t[kInFlight], j[kInFlight];
      bool live[kInFlight];
      float v[kInFlight][8];
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        if (u == 0) {
          t[0] = base / nbc, j[0] = base % nbc;
        } else {
          t[u] = t[u - 1], j[u] = j[u - 1] + warps;
          while (j[u] >= nbc) j[u] -= nbc, ++t[u];
        }
        live[u] = base + u * warps < tasks;
#pragma unroll
        for (int i = 0; i < 8; ++i) v[u][i] = 0.f;
        if (live[u]) device::load_float8(x_of(t[u], j[u]), v[u]);
      }
      if (p.gamma) {
        float ss[kInFlight], gamma[kInFlight][8];
#pragma unroll
        for (int u = 0; u < kInFlight; ++u) ss[u] = lane_sum_squares(v[u]);
        device::warp_sums(ss);
#pragma unroll
        for (int u = 0; u < kInFlight; ++u) {
          if (!live[u]) continue;
          if (lane == 0) s.block_ss[t[u] * p.chunk_blocks + j[u]] = ss[u];
          device::ldg_float8(gamma_of(j[u]), gamma[u]);
        }
#pragma unroll
        for (int u = 0; u < kInFlight; ++u)
          if (live[u])
#pragma unroll
            for (int i = 0; i < 8; ++i) v[u][i] *= gamma[u][i];
      }
      quantize_tasks<F16>(s, t, j, live, v);
    }
  } else {
    constexpr int kInFlight = 4;
    for (int base = warp; base < tasks; base += warps * kInFlight) {
      float v[kInFlight][8];
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        const int task = base + u * warps;
        if (task >= tasks) break;
        device::load_float8(x_of(task / nbc, task % nbc), v[u]);
      }
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        const int task = base + u * warps;
        if (task >= tasks) break;
        const int t = task / nbc, j = task % nbc;
        if (p.gamma) {
          store_block_ss(p, s, t, j, v[u]);
          float gamma[8];
          device::ldg_float8(gamma_of(j), gamma);
#pragma unroll
          for (int i = 0; i < 8; ++i) v[u][i] *= gamma[i];
        }
        quantize_task<F16>(s, t, j, v[u]);
      }
    }
  }
}

// After a chunk's prologue (and a barrier): fold its per-block sums into each token's total (a
// warp per token: lane-strided partial sums, then a fixed butterfly). After the last chunk: 1/rms.
__device__ __forceinline__ void accumulate_rms(const GemvTileParams& p, int kb0, int nbc, const GemvSmem& s) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int t = warp; t < p.batch; t += kWarpsPerBlock) {
    float part = 0.f;
    for (int j = lane; j < nbc; j += 32) part += s.block_ss[t * p.chunk_blocks + j];
    part = device::warp_sum(part);
    if (lane == 0) {
      const float total = (kb0 == 0 ? 0.f : s.total_ss[t]) + part;
      s.total_ss[t] = total;
      if (kb0 + nbc == p.k_blocks) s.inv_rms[t] = rsqrtf(total / float(p.k_blocks * 256) + p.eps);
    }
  }
}

// Writes output (row, token t) from the row's gate (or only) sum g and up sum u, before the RMS
// scale: the epilogue of every core.
__device__ __forceinline__ void store_output(const GemvTileParams& p, const GemvSmem& s, std::int64_t row, int t,
                                             float g, float u) {
  const float scale = p.gamma ? s.inv_rms[t] : 1.f;
  const std::int64_t at = t * p.out_stride + row;
  g *= scale;
  if (p.epilogue == Epilogue::kStore) {
    p.out[0][at] = p.residual ? g + p.residual[at] : g;
  } else {
    u *= scale;
    if (p.epilogue == Epilogue::kSiluMul) {
      p.out[0][at] = g / (1.f + expf(-g)) * u;
    } else {
      p.out[0][at] = g;
      p.out[1][at] = u;
    }
  }
}

// Tile 0 writes rmsnorm(x) * gamma when asked.
__device__ __forceinline__ void store_normalized(const GemvTileParams& p, const GemvSmem& s, std::int64_t tile) {
  if (!p.normalized || tile != 0) return;
  const std::int64_t k = std::int64_t(p.k_blocks) * 256;
  for (int t = 0; t < p.batch; ++t)
    for (std::int64_t j = threadIdx.x; j < k; j += kBlockThreads)
      p.normalized[t * k + j] = p.x[t * p.x_stride + j] * s.inv_rms[t] * p.gamma[j];
}

// The activation region of a block's shared memory: act .. the end of block_ss (16-byte multiple).
__host__ __device__ inline std::size_t image_begin(const GemvSmem& s) { return std::size_t(s.act - reinterpret_cast<char*>(s.bars)); }
__host__ __device__ inline std::size_t image_bytes(const GemvSmem& s) {
  const char* end = reinterpret_cast<const char*>(s.block_ss + std::size_t(s.tokens) * s.chunk_blocks);
  return (std::size_t(end - s.act) + 15) / 16 * 16;
}

// Copies the prepared activation region (p.act_image) into shared memory, then the RMS sums.
__device__ __forceinline__ void copy_image(const GemvTileParams& p, const GemvSmem& s) {
  __syncthreads();
  const std::size_t begin = image_begin(s), bytes = image_bytes(s);
  for (std::size_t i = threadIdx.x * 16; i < bytes; i += kBlockThreads * 16) device::cp_async_16(s.act + i, p.act_image + begin + i);
  device::cp_async_commit();
  device::cp_async_wait_all();
  __syncthreads();
  if (p.gamma) {
    accumulate_rms(p, 0, p.k_blocks, s);
    __syncthreads();
  }
}

// Quantises chunk [kb0, kb0 + nbc) of the activations (and its RMS sums) unless they are cached.
template <int NTOK, bool F16, bool kStaged>
__device__ __forceinline__ void load_chunk(const GemvTileParams& p, int kb0, int nbc, const GemvSmem& s) {
  __syncthreads();  // the previous chunk's readers are done
  quantize_chunk<NTOK, F16, kStaged>(p, kb0, nbc, s);
  __syncthreads();
  if (p.gamma) {
    accumulate_rms(p, kb0, nbc, s);
    __syncthreads();
  }
}

// The mma core multiplies whole 8-token tiles: the activation slots of tokens batch..ntok-1 get
// zero codes and scales, so no product reads uninitialised shared memory (their outputs are never
// stored).
__device__ __forceinline__ void zero_missing_tokens(const GemvTileParams& p, int ntok, const GemvSmem& s) {
  const int vectors = (ntok - p.batch) * s.chunk_blocks * kActStride / 16;
  int4* first = reinterpret_cast<int4*>(s.act_block(p.batch, 0));
  for (int i = threadIdx.x; i < vectors; i += kBlockThreads) first[i] = make_int4(0, 0, 0, 0);
  __syncthreads();
}

// The same for the fp16 core's format: zero values, sums and scales for tokens batch..ntok-1.
__device__ __forceinline__ void zero_missing_tokens_f16(const GemvTileParams& p, int ntok, const GemvSmem& s) {
  const int value_vectors = (ntok - p.batch) * s.f16_token_pitch / 16;
  int4* first = reinterpret_cast<int4*>(s.f16_values(p.batch, 0));
  for (int i = threadIdx.x; i < value_vectors; i += kBlockThreads) first[i] = make_int4(0, 0, 0, 0);
  const int missing = ntok - p.batch, entries = s.chunk_blocks * missing;
  for (int i = threadIdx.x; i < entries; i += kBlockThreads) {
    const int token = p.batch + i % missing, j = i / missing;
    int4* sums = reinterpret_cast<int4*>(s.f16_sums_of(token, j));
    sums[0] = sums[1] = make_int4(0, 0, 0, 0);
    *s.f16_scale_of(token, j) = 0.f;
  }
  __syncthreads();
}

}  // namespace detail

}  // namespace encore::gemv
