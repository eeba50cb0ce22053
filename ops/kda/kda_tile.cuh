// KDA decode device body: one tile = one (sequence, head), 256 threads = 8 warps x (V/8) v-rows.
// Used by the standalone kernel (kda.cu) and by the megakernel (kda_body). Math: docs/kda.md §3.
//
// Order inside a tile (every phase reads only what the tile owns, so tiles never race):
//   0. copy the head's W_fb and W_gb rows (2 x K x rank bf16, 64 KiB for Kimi-Linear) into shared
//      memory with cp.async (the standalone kernel issues this before griddepcontrol.wait: weights
//      do not depend on upstream kernels); tile_load_slot: the slot id, then this warp's V/8 state
//      rows into registers (float4 / float2 per lane, streaming hint) and the conv history, so the
//      64 KiB of state are in flight while the rest is computed (before the wait too when the
//      caller says the states are settled);
//   1. the proj inputs and the error flag in one round trip; conv + SiLU on the tile's 3 x K
//      channels, advance their history (raw inputs);
//   2. every warp: L2 norms of q and k and k.q (redundantly per warp: no block barrier needed);
//      thread per gate row (two for K=64): f = W_fb f_a -> alpha, r = W_gb g_a -> sigmoid(r);
//   3. state pass per v-row: s' = alpha*s; p = s'.k; a = s'.q; u = beta (v - p); s = s' + k u;
//      o = a + (k.q) u   (reads the state once, writes it once; the 2 x 16 row sums of a warp are
//      reduced by one transposed butterfly, 31 shuffles instead of 160);
//   4. gated RMSNorm of o over the head, write y.
//
// The chain after the wait (proj -> conv -> gates -> state pass -> norm), not the bytes, bounds
// the tile at batch 1; measurements and what was tried: bench/notes/.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>

#include <encore/ops/kda.h>

#include "common/async_copy.cuh"
#include "common/body.cuh"
#include "common/block.h"
#include "common/smem_allocator.cuh"
#include "common/warp.cuh"

namespace encore::kda {

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
    device::SmemAllocator alloc(base);
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

using device::warp_sum;
__device__ __forceinline__ float sigmoid(float x) { return 1.f / (1.f + expf(-x)); }
__device__ __forceinline__ float softplus(float x) { return x > 20.f ? x : log1pf(expf(x)); }

__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}


// Shared layout of a gate-weight row: 16-byte chunk c of row j sits at chunk c ^ (j & 7), so the
// 8 rows read by a quarter-warp at the same c hit 8 different bank groups (rank % 64 == 0).
__device__ __forceinline__ int swizzle(int row, int chunk) { return chunk ^ (row & 7); }


// Step 0a: starts the copy of the tile's gate weights (W_fb and W_gb rows of its head) into shared
// memory. Weights never depend on upstream kernels, so this may run before griddepcontrol.wait.
// Every thread must later pass device::cp_async_wait_all() + __syncthreads() before reading them.
template <int HeadDim>
__device__ __forceinline__ void tile_issue_weight_copy(const ops::KdaParams& p, int tile_index, char* smem_base) {
  constexpr int D = HeadDim;
  const int head = tile_index % p.num_heads;
  const Smem sm = Smem::carve(smem_base, D, p.gate_rank);
  const int chunks = D * p.gate_rank / 8;  // 16-byte chunks per matrix
  const uint4* fb = reinterpret_cast<const uint4*>(p.f_b_weight + std::int64_t(head) * D * p.gate_rank);
  const uint4* gb = reinterpret_cast<const uint4*>(p.g_b_weight + std::int64_t(head) * D * p.gate_rank);
  uint4* dst = reinterpret_cast<uint4*>(sm.gate_weights);
  const int row_chunks = p.gate_rank / 8;
  for (int c = threadIdx.x; c < chunks; c += kBlockThreads) {
    const int row = c / row_chunks, chunk = c - row * row_chunks;
    const int slot = row * row_chunks + swizzle(row, chunk);
    device::cp_async_16(dst + slot, fb + c);
    device::cp_async_16(dst + D * row_chunks + slot, gb + c);  // row + D has the same swizzle (D % 8 == 0)
  }
}

// Dot product of gate-weight row j (shared, swizzled) with the fp32 vector vec[rank], by
// ThreadsPerRow adjacent threads (part = 0..ThreadsPerRow-1 takes chunks part, part + ThreadsPerRow, ...).
template <int ThreadsPerRow>
__device__ __forceinline__ float gate_row_dot(const Smem& sm, int j, int part, int chunks, const float* vec) {
  const uint4* row = reinterpret_cast<const uint4*>(sm.gate_weights) + j * chunks;
  float acc = 0.f;
#pragma unroll 4
  for (int c = part; c < chunks; c += ThreadsPerRow) {
    const uint4 raw = row[swizzle(j, c)];
    const float4 x0 = reinterpret_cast<const float4*>(vec)[2 * c];
    const float4 x1 = reinterpret_cast<const float4*>(vec)[2 * c + 1];
    // bf16 -> fp32 is a 16-bit shift (exact); element 2i is the low half of word i.
    acc = fmaf(__uint_as_float(raw.x << 16), x0.x, acc);
    acc = fmaf(__uint_as_float(raw.x & 0xffff0000u), x0.y, acc);
    acc = fmaf(__uint_as_float(raw.y << 16), x0.z, acc);
    acc = fmaf(__uint_as_float(raw.y & 0xffff0000u), x0.w, acc);
    acc = fmaf(__uint_as_float(raw.z << 16), x1.x, acc);
    acc = fmaf(__uint_as_float(raw.z & 0xffff0000u), x1.y, acc);
    acc = fmaf(__uint_as_float(raw.w << 16), x1.z, acc);
    acc = fmaf(__uint_as_float(raw.w & 0xffff0000u), x1.w, acc);
  }
#pragma unroll
  for (int m = ThreadsPerRow / 2; m > 0; m >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, m);
  return acc;
}

// Sums each of v[0..Count) over the 32 lanes with Count - 1 + (5 - log2 Count) shuffles instead of
// 5 * Count: at each level a lane keeps one half of its values and trades the other half with its
// partner (lane ^ Mask). Afterwards v[0] of lane L holds the total of value L * Count / 32.
template <int Count, int Mask, int N>
__device__ __forceinline__ void warp_transpose_sum(float (&v)[N], int lane) {
  if constexpr (Mask >= 1) {
    if constexpr (Count > 1) {
      constexpr int kHalf = Count / 2;
      const bool upper = (lane & Mask) != 0;
#pragma unroll
      for (int i = 0; i < kHalf; ++i) {
        const float send = upper ? v[i] : v[i + kHalf];
        const float keep = upper ? v[i + kHalf] : v[i];
        v[i] = keep + __shfl_xor_sync(0xffffffffu, send, Mask);
      }
      warp_transpose_sum<kHalf, Mask / 2>(v, lane);
    } else {
      v[0] += __shfl_xor_sync(0xffffffffu, v[0], Mask);
      warp_transpose_sum<1, Mask / 2>(v, lane);
    }
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

// What a tile reads from its slot: this warp's state rows and the conv history of the thread's
// channels (with their conv weights), loaded by tile_load_slot() and consumed by tile(); and its
// head's constants the thread uses (weights: tile_load_head(), before the body's wait).
template <int HeadDim>
struct SlotInputs {
  static constexpr int kPerThread = (3 * HeadDim + kBlockThreads - 1) / kBlockThreads;  // conv channels per thread
  int slot;
  LaneVec<Traits<HeadDim>::kLaneElems> s[Traits<HeadDim>::kRowsPerWarp];
  float h0[kPerThread], h1[kPerThread], h2[kPerThread];
  float4 w[kPerThread];
  float a_log, dt_bias, o_norm;  // the head's A_log, the thread's decay row's dt_bias, its output's norm weight
};

// Tile channel c (q | k | v, K each) -> its proj / history column.
template <int HeadDim>
__device__ __forceinline__ std::int64_t conv_channel(int c, int head, std::int64_t P) {
  const int stream = c / HeadDim;
  return stream * P + std::int64_t(head) * HeadDim + (c - stream * HeadDim);
}

// Where a tile and the calling thread sit: heads, the tile's batch row and head, the thread's
// lane and warp, and the widths of one proj stream (H * D) and of the three (q | k | v).
struct TilePlace {
  int H, row, head, tid, lane, warp;
  std::int64_t P, channels;
  __device__ TilePlace(const ops::KdaParams& p, int tile_index, int D)
      : H(p.num_heads), row(tile_index / H), head(tile_index - row * H), tid(threadIdx.x), lane(tid & 31),
        warp(tid >> 5), P(std::int64_t(H) * D), channels(3 * P) {}
};

// Step 0b: the slot id, then this warp's state rows and the conv history in flight (one memory
// round trip after the id). Nothing for a pad row or an out-of-range id. Reads only the slot ids
// and the pools: runs before griddepcontrol.wait when they are settled (KdaParams::state_settled).
template <int HeadDim>
__device__ __forceinline__ void tile_load_slot(const ops::KdaParams& p, int tile_index, SlotInputs<HeadDim>& in) {
  using T = Traits<HeadDim>;
  constexpr int D = HeadDim, E = T::kLaneElems, R = T::kRowsPerWarp;
  const TilePlace at(p, tile_index, D);
  const int H = at.H, row = at.row, head = at.head, tid = at.tid, lane = at.lane, warp = at.warp;
  const std::int64_t P = at.P, channels = at.channels;
  in.slot = p.slot_ids[row];
  if (in.slot >= p.num_slots || in.slot < 0) return;
  const float* state = p.recurrent_state + (std::int64_t(in.slot) * H + head) * D * D;
#pragma unroll
  for (int r = 0; r < R; ++r) load_stream(state + (warp * R + r) * D + lane * E, in.s[r]);
  const float* history = p.conv_state + std::int64_t(in.slot) * 3 * channels;  // [3][channels]
#pragma unroll
  for (int i = 0; i < SlotInputs<D>::kPerThread; ++i) {
    const int c = tid + i * kBlockThreads;
    if (c < 3 * D) {
      const std::int64_t ch = conv_channel<D>(c, head, P);
      in.h0[i] = history[ch], in.h1[i] = history[channels + ch], in.h2[i] = history[2 * channels + ch];
      in.w[i] = __ldg(reinterpret_cast<const float4*>(p.conv_weight) + ch);
    }
  }
}

// The tile's head's constants the thread uses in tile(): weights, so they load before the wait
// (the gates and the output norm otherwise wait a round trip each after it).
template <int HeadDim>
__device__ __forceinline__ void tile_load_head(const ops::KdaParams& p, int tile_index, SlotInputs<HeadDim>& in) {
  constexpr int D = HeadDim, kThreadsPerRow = kBlockThreads / (2 * D);
  const int head = tile_index % p.num_heads, j = int(threadIdx.x) / kThreadsPerRow;
  in.a_log = p.A_log[head];
  if (j < D) in.dt_bias = p.dt_bias[std::int64_t(head) * D + j];
  if (int(threadIdx.x) < D) in.o_norm = p.o_norm_weight[threadIdx.x];
}

// weights_issued: tile_issue_weight_copy() already ran for this tile (the kernel prologue does it
// for its first tile, before griddepcontrol.wait); `in`: tile_load_slot() of this tile.
// next_tile >= 0: once the gates are computed the gate weights' buffer is free, so the copy of
// that tile's weights (and an L2 prefetch of its state) starts under this tile's state pass.
// Returns whether it did (a pad or flagged tile returns before). Marks (device::mark, traced
// megakernel only): the gate weights and proj landed, the state pass done, the tile's end (pad and
// flagged tiles mark their end too).
template <int HeadDim, class Wait>
__device__ __forceinline__ bool tile(const ops::KdaParams& p, int tile_index, char* smem_base, bool weights_issued,
                                     SlotInputs<HeadDim>& in, Wait& wait, int next_tile = -1) {
  using T = Traits<HeadDim>;
  constexpr int D = HeadDim, E = T::kLaneElems, R = T::kRowsPerWarp;
  const TilePlace at(p, tile_index, D);
  const int H = at.H, row = at.row, head = at.head, tid = at.tid, lane = at.lane, warp = at.warp;
  const std::int64_t P = at.P, channels = at.channels;
  float* y_head = p.y + std::int64_t(row) * P + std::int64_t(head) * D;

  if (!weights_issued) {
    __syncthreads();  // the previous tile of this block may still read shared memory
    tile_issue_weight_copy<D>(p, tile_index, smem_base);
  }
  // What the previous kernel wrote, loaded with the flag in one round trip: x_t of the thread's
  // conv channels, its share of f_a | g_a (2 * gate_rank <= 512 values), beta's logit.
  constexpr int kPerThread = SlotInputs<D>::kPerThread, kGateInputsPerThread = 2;
  const float* x = p.proj + std::int64_t(row) * p.proj_stride;
  const std::int64_t fa_offset = channels;
  float xt[kPerThread], fa_ga[kGateInputsPerThread];
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int c = tid + i * kBlockThreads;
    if (c < 3 * D) xt[i] = x[conv_channel<D>(c, head, P)];
  }
#pragma unroll
  for (int i = 0; i < kGateInputsPerThread; ++i) {
    const int t = tid + i * kBlockThreads;
    if (t < 2 * p.gate_rank) fa_ga[i] = x[fa_offset + t];
  }
  const float beta_logit = x[fa_offset + 2 * p.gate_rank + head];
  const int slot = in.slot;
  const bool flagged = p.error_flag != nullptr && __ldcg(p.error_flag) != 0;
  if (flagged || slot >= p.num_slots || slot < 0) {
    device::cp_async_wait_all();  // no copy may land after this tile returns
    // Pad row: y = 0. Failed slot check or out-of-range id: no state write, y = NaN.
    const float fill = (slot < 0 && !flagged) ? 0.f : __int_as_float(0x7fffffff);
    for (int j = tid; j < D; j += kBlockThreads) y_head[j] = fill;
    device::mark(wait, device::Mark::kItemEnd, tile_index);  // every tile that begins ends, pad rows too
    return false;
  }
  const Smem sm = Smem::carve(smem_base, D, p.gate_rank);
  float* state = p.recurrent_state + (std::int64_t(slot) * H + head) * D * D;
  const int v_begin = warp * R;
  LaneVec<E>(&s)[R] = in.s;

  // 1. conv + SiLU, history advance.
  float* history = p.conv_state + std::int64_t(slot) * 3 * channels;  // [3][channels]
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int c = tid + i * kBlockThreads;
    if (c < 3 * D) {
      const std::int64_t ch = conv_channel<D>(c, head, P);
      const float4 w = in.w[i];
      const float conv = w.x * in.h0[i] + w.y * in.h1[i] + w.z * in.h2[i] + w.w * xt[i];
      sm.qkv[c] = conv * sigmoid(conv);
      history[ch] = in.h1[i];
      history[channels + ch] = in.h2[i];
      history[2 * channels + ch] = xt[i];
    }
  }
#pragma unroll
  for (int i = 0; i < kGateInputsPerThread; ++i) {
    const int t = tid + i * kBlockThreads;
    if (t < 2 * p.gate_rank) sm.fa_ga[t] = fa_ga[i];
  }
  const float beta = sigmoid(beta_logit);
  device::cp_async_wait_all();
  __syncthreads();
  device::mark(wait, device::Mark::kItemWeights, tile_index);

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

  // 2b. gates: rows 0..D-1 of W_fb (decay), D..2D-1 of W_gb (output gate); kThreadsPerRow threads
  // per row read its swizzled 16-byte chunks from shared memory (conflict-free), no shuffles for K=128.
  {
    constexpr int kThreadsPerRow = kBlockThreads / (2 * D);  // 1 (K=128) or 2 (K=64)
    const int j = tid / kThreadsPerRow, part = tid % kThreadsPerRow;
    const int chunks = p.gate_rank / 8;
    const bool decay = j < D;
    const float dot = gate_row_dot<kThreadsPerRow>(sm, j, part, chunks, decay ? sm.fa_ga : sm.fa_ga + p.gate_rank);
    if (part == 0) {
      if (decay)
        sm.alpha[j] = expf(-expf(in.a_log) * softplus(dot + in.dt_bias));
      else
        sm.gate[j - D] = sigmoid(dot);
    }
  }
  __syncthreads();
  if (next_tile >= 0) {  // every thread is done with the gate weights
    tile_issue_weight_copy<D>(p, next_tile, smem_base);
    tile_prefetch_state<D>(p, next_tile);
  }
  const LaneVec<E> alpha = load_shared<E>(sm.alpha + lane * E);

  // 3. state pass. Partial sums per lane: sums[r] = p_v partial, sums[R + r] = (s'.q) partial of row
  // v_begin + r; one transposed butterfly reduces all 2R of them (lane L ends with value L / kSpread).
  constexpr int kSums = 2 * R, kSpread = 32 / kSums;
  float sums[kSums];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    float pv = 0.f, av = 0.f;
#pragma unroll
    for (int e = 0; e < E; ++e) {
      s[r].v[e] *= alpha.v[e];
      pv = fmaf(s[r].v[e], k.v[e], pv);
      av = fmaf(s[r].v[e], q.v[e], av);
    }
    sums[r] = pv, sums[R + r] = av;
  }
  warp_transpose_sum<kSums, 16>(sums, lane);
  const float total = sums[0];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int v = v_begin + r;
    const float pred = __shfl_sync(0xffffffffu, total, r * kSpread);
    const float u = beta * (sm.qkv[2 * D + v] - pred);
#pragma unroll
    for (int e = 0; e < E; ++e) s[r].v[e] = fmaf(k.v[e], u, s[r].v[e]);
    store_stream(state + v * D + lane * E, s[r]);
    if (lane == (R + r) * kSpread) sm.o[v] = fmaf(kq, u, total);
  }
  __syncthreads();
  device::mark(wait, device::Mark::kItemComputed, tile_index);

  // 4. gated RMSNorm over the head (warps covering the head's V values; each sums all of o).
  if (tid < D) {
    const LaneVec<E> o = load_shared<E>(sm.o + lane * E);
    float ss = 0.f;
#pragma unroll
    for (int e = 0; e < E; ++e) ss = fmaf(o.v[e], o.v[e], ss);
    ss = warp_sum(ss);
    const float inv_rms = 1.f / sqrtf(ss / float(D) + p.norm_eps);
    y_head[tid] = sm.o[tid] * inv_rms * in.o_norm * sm.gate[tid];
  }
  device::mark(wait, device::Mark::kItemEnd, tile_index);
  return next_tile >= 0;
}


// The KDA body (common/body.cuh), one (sequence, head) per tile: the first tile's gate weights
// and, when settled, its slot state are in flight before the wait; a block with several tiles
// starts each next tile's weights under the previous tile's state pass.
template <int HeadDim, class Range, class Wait>
__device__ void kda_body(const ops::KdaParams& p, const Range& r, char* smem, Wait& wait) {
  const int tiles = p.batch * p.num_heads;
  int tile = r.first();
  if (tile >= tiles) return;
  device::mark(wait, device::Mark::kItemBegin, tile);
  kda::tile_issue_weight_copy<HeadDim>(p, tile, smem);
  kda::SlotInputs<HeadDim> in;
  kda::tile_load_head<HeadDim>(p, tile, in);
  if (p.state_settled)
    kda::tile_load_slot<HeadDim>(p, tile, in);
  else
    kda::tile_prefetch_state<HeadDim>(p, tile);
  device::mark(wait, device::Mark::kStreamReady, -1);  // the prologue's loads are issued
  wait();  // proj and the error flag (and unsettled slot ids and states) come from upstream
  if (!p.state_settled) kda::tile_load_slot<HeadDim>(p, tile, in);
  if (Range::kOneTile || tile + r.stride() >= tiles) {  // the block's only tile
    kda::tile<HeadDim>(p, tile, smem, true, in, wait);
  } else {  // each tile starts the next one's weights under its own state pass; one call site, so
            // a block with several tiles runs one copy of the tile's code (docs/megakernel.md §4)
    auto next_of = [&](int t) { return t + r.stride() < tiles ? t + r.stride() : -1; };
    bool issued = true;  // (the first tile's weights and slot were loaded above)
    for (bool first = true; tile < tiles; tile += r.stride(), first = false) {
      if (!first) {
        device::mark(wait, device::Mark::kItemBegin, tile);
        kda::tile_load_head<HeadDim>(p, tile, in);
        kda::tile_load_slot<HeadDim>(p, tile, in);
      }
      issued = kda::tile<HeadDim>(p, tile, smem, issued, in, wait, next_of(tile));
    }
  }
}

}  // namespace encore::kda
