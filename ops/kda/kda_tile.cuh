// KDA decode device body: one tile = one (sequence, head), 256 threads = 8 warps x (V/8) v-rows.
// Used by the standalone kernel (kda.cu) and by the megakernel. Math: shared/specs/kda.md §3.
//
// Order inside a tile (every phase reads only what the tile owns, so tiles never race):
//   0. copy the head's W_fb and W_gb rows (2 x K x rank bf16, 64 KiB for Kimi-Linear) into shared
//      memory with cp.async (the standalone kernel issues this before griddepcontrol.wait: weights
//      do not depend on upstream kernels); load this warp's V/8 state rows into registers
//      (float4 / float2 per lane, streaming hint), so the 64 KiB of state are in flight while the
//      rest is computed;
//   1. conv + SiLU on the tile's 3 x K channels, advance their history (raw inputs);
//   2. every warp: L2 norms of q and k and k.q (redundantly per warp: no block barrier needed);
//      half-warp per row: f = W_fb f_a -> alpha, r = W_gb g_a -> sigmoid(r);
//   3. state pass per v-row: s' = alpha*s; p = s'.k; a = s'.q; u = beta (v - p); s = s' + k u;
//      o = a + (k.q) u   (reads the state once, writes it once);
//   4. gated RMSNorm of o over the head, write y.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>

#include <encore/ops/kda.h>

#include "common/launch.cuh"

namespace encore::device {
namespace kda {

template <int HeadDim>
struct Traits {
  static_assert(HeadDim == 64 || HeadDim == 128, "KDA head_dim must be 64 or 128");
  static constexpr int kLaneElems = HeadDim / 32;                // k values per lane
  static constexpr int kRowsPerWarp = HeadDim / kWarpsPerBlock;  // v-rows per warp
};

// Shared-memory plan of one tile (carved identically on host and device).
struct Smem {
  __nv_bfloat16* gate_weights;  // [2][K][rank] W_fb rows | W_gb rows of the head
  float* qkv;    // [3][K]  conv + SiLU outputs q | k | v of the tile
  float* fa_ga;  // [2][rank] f_a | g_a of the row
  float* alpha;  // [K]     decay per channel
  float* gate;   // [V]     sigmoid(g_b g_a)
  float* o;      // [V]     recurrence output
  __host__ __device__ static Smem carve(char* base, int head_dim, int gate_rank, std::size_t* bytes = nullptr) {
    SmemAllocator alloc(base);
    Smem s;
    s.gate_weights = alloc.take<__nv_bfloat16>(2 * head_dim * gate_rank);
    s.qkv = alloc.take<float>(3 * head_dim);
    s.fa_ga = alloc.take<float>(2 * gate_rank);
    s.alpha = alloc.take<float>(head_dim);
    s.gate = alloc.take<float>(head_dim);
    s.o = alloc.take<float>(head_dim);
    if (bytes) *bytes = alloc.used();
    return s;
  }
};

template <int N>
struct LaneVec {
  float v[N];
};

// Streaming (evict-first) loads/stores of a lane's contiguous N floats.
__device__ __forceinline__ void load_stream(const float* p, LaneVec<4>& out) {
  const float4 t = __ldcs(reinterpret_cast<const float4*>(p));
  out.v[0] = t.x, out.v[1] = t.y, out.v[2] = t.z, out.v[3] = t.w;
}
__device__ __forceinline__ void load_stream(const float* p, LaneVec<2>& out) {
  const float2 t = __ldcs(reinterpret_cast<const float2*>(p));
  out.v[0] = t.x, out.v[1] = t.y;
}
__device__ __forceinline__ void store_stream(float* p, const LaneVec<4>& in) {
  __stcs(reinterpret_cast<float4*>(p), make_float4(in.v[0], in.v[1], in.v[2], in.v[3]));
}
__device__ __forceinline__ void store_stream(float* p, const LaneVec<2>& in) {
  __stcs(reinterpret_cast<float2*>(p), make_float2(in.v[0], in.v[1]));
}
template <int N>
__device__ __forceinline__ LaneVec<N> load_shared(const float* p) {
  LaneVec<N> r;
#pragma unroll
  for (int e = 0; e < N; ++e) r.v[e] = p[e];
  return r;
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) x += __shfl_xor_sync(0xffffffffu, x, m);
  return x;
}
__device__ __forceinline__ float sigmoid(float x) { return 1.f / (1.f + expf(-x)); }
__device__ __forceinline__ float softplus(float x) { return x > 20.f ? x : log1pf(expf(x)); }

__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

// Dot product of one bf16 weight row (global or shared) with a shared fp32 vector, by the 16 lanes
// of a half-warp (each lane takes 8-value chunks lane16, lane16 + 16, ...); every lane of the half
// gets the sum.
__device__ __forceinline__ float half_warp_dot_bf16(const __nv_bfloat16* row, const float* vec, int rank,
                                                    int lane16) {
  float acc = 0.f;
  for (int c = lane16; c < rank / 8; c += 16) {
    const uint4 raw = reinterpret_cast<const uint4*>(row)[c];
    const std::uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
    const float* x = vec + 8 * c;
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      // bf16 -> fp32 is a 16-bit shift (exact).
      acc = fmaf(__uint_as_float(words[w] << 16), x[2 * w], acc);
      acc = fmaf(__uint_as_float(words[w] & 0xffff0000u), x[2 * w + 1], acc);
    }
  }
#pragma unroll
  for (int m = 8; m > 0; m >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, m);
  return acc;
}

__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* global_src) {
  const unsigned dst = unsigned(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(global_src) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }

// Step 0a: starts the copy of the tile's gate weights (W_fb and W_gb rows of its head) into shared
// memory. Weights never depend on upstream kernels, so this may run before griddepcontrol.wait.
// Every thread must later pass cp_async_wait_all() + __syncthreads() before reading them.
template <int HeadDim>
__device__ __forceinline__ void tile_issue_weight_copy(const ops::KdaParams& p, int tile_index, char* smem_base) {
  constexpr int D = HeadDim;
  const int head = tile_index % p.num_heads;
  const Smem sm = Smem::carve(smem_base, D, p.gate_rank);
  const int chunks = D * p.gate_rank / 8;  // 16-byte chunks per matrix
  const uint4* fb = reinterpret_cast<const uint4*>(p.f_b_weight + std::int64_t(head) * D * p.gate_rank);
  const uint4* gb = reinterpret_cast<const uint4*>(p.g_b_weight + std::int64_t(head) * D * p.gate_rank);
  uint4* dst = reinterpret_cast<uint4*>(sm.gate_weights);
  for (int c = threadIdx.x; c < chunks; c += kBlockThreads) {
    cp_async_16(dst + c, fb + c);
    cp_async_16(dst + chunks + c, gb + c);
  }
}

// Warms L2 with the slot's recurrent and conv state, a harmless hint (the slot id may be stale
// before griddepcontrol.wait; L2 is the point of coherence, so a line prefetched early is still
// updated by a late writer).
template <int HeadDim>
__device__ __forceinline__ void tile_prefetch_state(const ops::KdaParams& p, int tile_index) {
  constexpr int D = HeadDim;
  const int row = tile_index / p.num_heads, head = tile_index - row * p.num_heads;
  const int slot = p.slot_ids[row];
  if (slot < 0 || slot >= p.num_slots) return;
  const char* state =
      reinterpret_cast<const char*>(p.recurrent_state + (std::int64_t(slot) * p.num_heads + head) * D * D);
  for (int off = threadIdx.x * 128; off < D * D * 4; off += kBlockThreads * 128) prefetch_l2(state + off);
  // conv history: 3 taps x 3 streams x D floats, 128-byte lines
  const std::int64_t P = std::int64_t(p.num_heads) * D, channels = 3 * P;
  constexpr int kLinesPerSegment = D * 4 / 128;
  if (threadIdx.x < 9 * kLinesPerSegment) {
    const int segment = threadIdx.x / kLinesPerSegment, line = threadIdx.x % kLinesPerSegment;
    const int tap = segment / 3, stream = segment % 3;
    prefetch_l2(p.conv_state + (std::int64_t(slot) * 3 + tap) * channels + stream * P + std::int64_t(head) * D +
                line * 32);
  }
}

// weights_issued: tile_issue_weight_copy() already ran for this tile (the kernel prologue does it
// for its first tile, before griddepcontrol.wait).
template <int HeadDim>
__device__ __forceinline__ void tile(const ops::KdaParams& p, int tile_index, char* smem_base, bool weights_issued) {
  using T = Traits<HeadDim>;
  constexpr int D = HeadDim, E = T::kLaneElems, R = T::kRowsPerWarp;
  const int H = p.num_heads;
  const int row = tile_index / H, head = tile_index - row * H;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const std::int64_t P = std::int64_t(H) * D, channels = 3 * P;
  float* y_head = p.y + std::int64_t(row) * P + std::int64_t(head) * D;

  if (!weights_issued) {
    __syncthreads();  // the previous tile of this block may still read shared memory
    tile_issue_weight_copy<D>(p, tile_index, smem_base);
  }
  const int slot = p.slot_ids[row];
  const bool flagged = p.error_flag != nullptr && __ldcg(p.error_flag) != 0;
  if (flagged || slot >= p.num_slots || slot < 0) {
    cp_async_wait_all();  // no copy may land after this tile returns
    // Pad row: y = 0. Failed slot check or out-of-range id: no state write, y = NaN.
    const float fill = (slot < 0 && !flagged) ? 0.f : __int_as_float(0x7fffffff);
    for (int j = tid; j < D; j += kBlockThreads) y_head[j] = fill;
    return;
  }
  const Smem sm = Smem::carve(smem_base, D, p.gate_rank);

  // 0. state rows of this warp in flight.
  float* state = p.recurrent_state + (std::int64_t(slot) * H + head) * D * D;
  const int v_begin = warp * R;
  LaneVec<E> s[R];
#pragma unroll
  for (int r = 0; r < R; ++r) load_stream(state + (v_begin + r) * D + lane * E, s[r]);

  // 1. conv + SiLU, history advance.
  const float* x = p.proj + std::int64_t(row) * p.proj_stride;
  float* history = p.conv_state + std::int64_t(slot) * 3 * channels;  // [3][channels]
  for (int c = tid; c < 3 * D; c += kBlockThreads) {
    const int stream = c / D, j = c - stream * D;
    const std::int64_t ch = stream * P + std::int64_t(head) * D + j;
    const float h0 = history[ch], h1 = history[channels + ch], h2 = history[2 * channels + ch];
    const float xt = x[ch];
    const float4 w = __ldg(reinterpret_cast<const float4*>(p.conv_weight) + ch);
    const float conv = w.x * h0 + w.y * h1 + w.z * h2 + w.w * xt;
    sm.qkv[c] = conv * sigmoid(conv);
    history[ch] = h1;
    history[channels + ch] = h2;
    history[2 * channels + ch] = xt;
  }
  const std::int64_t fa_offset = channels;
  for (int t = tid; t < 2 * p.gate_rank; t += kBlockThreads) sm.fa_ga[t] = x[fa_offset + t];
  const float beta = sigmoid(x[fa_offset + 2 * p.gate_rank + head]);
  cp_async_wait_all();
  __syncthreads();

  // 2a. norms (each warp computes them for itself).
  LaneVec<E> q = load_shared<E>(sm.qkv + lane * E), k = load_shared<E>(sm.qkv + D + lane * E);
  float qq = 0.f, kk = 0.f, kq = 0.f;
#pragma unroll
  for (int e = 0; e < E; ++e) {
    qq = fmaf(q.v[e], q.v[e], qq);
    kk = fmaf(k.v[e], k.v[e], kk);
    kq = fmaf(k.v[e], q.v[e], kq);
  }
  qq = warp_sum(qq), kk = warp_sum(kk), kq = warp_sum(kq);
  const float q_scale = 1.f / sqrtf(float(D));
  const float q_factor = q_scale / sqrtf(qq + ops::kKdaL2NormEps);
  const float k_factor = 1.f / sqrtf(kk + ops::kKdaL2NormEps);
#pragma unroll
  for (int e = 0; e < E; ++e) q.v[e] *= q_factor, k.v[e] *= k_factor;
  kq *= q_factor * k_factor;  // = k_hat . q_hat

  // 2b. gates: rows 0..D-1 of W_fb (decay), D..2D-1 of W_gb (output gate), a half-warp per row.
  {
    const int half = lane >> 4, lane16 = lane & 15;
    const float neg_a = -expf(p.A_log[head]);
    for (int j = 2 * warp + half; j < 2 * D; j += 2 * kWarpsPerBlock) {
      const bool decay = j < D;
      const int jj = decay ? j : j - D;
      const float dot = half_warp_dot_bf16(sm.gate_weights + j * p.gate_rank,
                                           decay ? sm.fa_ga : sm.fa_ga + p.gate_rank, p.gate_rank, lane16);
      if (lane16 == 0) {
        if (decay)
          sm.alpha[jj] = expf(neg_a * softplus(dot + p.dt_bias[std::int64_t(head) * D + jj]));
        else
          sm.gate[jj] = sigmoid(dot);
      }
    }
  }
  __syncthreads();
  const LaneVec<E> alpha = load_shared<E>(sm.alpha + lane * E);

  // 3. state pass.
  float pred[R], read[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    float pv = 0.f, av = 0.f;
#pragma unroll
    for (int e = 0; e < E; ++e) {
      s[r].v[e] *= alpha.v[e];
      pv = fmaf(s[r].v[e], k.v[e], pv);
      av = fmaf(s[r].v[e], q.v[e], av);
    }
    pred[r] = pv, read[r] = av;
  }
#pragma unroll
  for (int m = 16; m > 0; m >>= 1)
#pragma unroll
    for (int r = 0; r < R; ++r) {
      pred[r] += __shfl_xor_sync(0xffffffffu, pred[r], m);
      read[r] += __shfl_xor_sync(0xffffffffu, read[r], m);
    }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int v = v_begin + r;
    const float u = beta * (sm.qkv[2 * D + v] - pred[r]);
#pragma unroll
    for (int e = 0; e < E; ++e) s[r].v[e] = fmaf(k.v[e], u, s[r].v[e]);
    store_stream(state + v * D + lane * E, s[r]);
    if (lane == r % 32) sm.o[v] = fmaf(kq, u, read[r]);
  }
  __syncthreads();

  // 4. gated RMSNorm over the head (warps covering the head's V values; each sums all of o).
  if (tid < D) {
    const LaneVec<E> o = load_shared<E>(sm.o + lane * E);
    float ss = 0.f;
#pragma unroll
    for (int e = 0; e < E; ++e) ss = fmaf(o.v[e], o.v[e], ss);
    ss = warp_sum(ss);
    const float inv_rms = 1.f / sqrtf(ss / float(D) + p.norm_eps);
    y_head[tid] = sm.o[tid] * inv_rms * p.o_norm_weight[tid] * sm.gate[tid];
  }
}

}  // namespace kda

// Megakernel entry: one (sequence, head) tile, any head_dim the launcher accepts.
__device__ __forceinline__ void kda_tile(const ops::KdaParams& p, int tile, char* smem) {
  if (p.head_dim == 128)
    kda::tile<128>(p, tile, smem, false);
  else
    kda::tile<64>(p, tile, smem, false);
}

}  // namespace encore::device
