// The expert stage's work list and input (docs/moe.md §4-§5): the parameters every expert body
// shares, the work list, and the quantiser of the experts' input.
//   build_work_list: from ids[batch][k]: entries grouped by expert in ascending id, tokens
//                  ascending inside an expert, shared experts appended as always-on
//                  pseudo-experts of weight 1, pad rows left out; each expert's entries cut into
//                  passes of tokens_per_pass; per token, its entries in ascending expert id.
//                  Shared expert s's entries start at batch * top_k + s * (real tokens), an
//                  offset the routing does not move, so build_shared_list can give a stream
//                  of the shared experts alone the same entries before the routing exists.
//                  Written to global memory by the prepare kernel (general plan) or to each
//                  stream block's shared memory (small batches: no prepare kernel).
//   prepare_tile : tile 0 builds the global work list; tile 1 + t quantises token t's row of h
//                  (or rmsnorm(h) * gamma, quantize_rows) to the int8 activation format of the
//                  Q4_K GEMVs (q4k/activation_q8.cuh).
// The streaming bodies are in moe_expert_stream.cuh, the epilogues in moe_epilogues.cuh.
// A (row, token) dot product runs the same code in the same order whatever the batch, so a
// token's output is bitwise independent of the other tokens.
#pragma once

#include <cstdint>

#include <cub/block/block_scan.cuh>

#include <encore/ops/moe.h>

#include "common/body.cuh"
#include "common/block.h"
#include "common/warp.cuh"
#include "q4k/activation_q8.cuh"

namespace encore::moe {

inline constexpr int kTokensPerPass = 8;     // most entries of one expert computed together (one per warp in the epilogue)
inline constexpr int kGateUpRows = 32;       // rows of gate and of up per item: one 32-value sub-block of the down input
inline constexpr int kDownRows = 64;         // output rows per down item (and per combine chunk)
inline constexpr int kRowSetRows = 8;        // one token's down: output rows per row-set item (moe_expert_stream.cuh)
inline constexpr int kMaxPlanExperts = ops::kMaxMoeExperts + ops::kMaxMoeShared;
inline constexpr int kPlanScanItems = (kMaxPlanExperts + kBlockThreads - 1) / kBlockThreads;

// (The expert weights reach the stream kernels as tensor maps: moe_expert_stream.cuh, StreamMaps.)
struct ExpertsTileParams {
  int num_experts, num_shared, top_k;
  int hidden, inter;
  int hidden_blocks, inter_blocks;  // hidden/256, inter/256
  int batch;
  int tokens_per_pass;           // <= kTokensPerPass, chosen by the host so the streams fit in shared memory
  const float* h;                // [batch][hidden]
  const float* gamma;            // optional [hidden]: quantise rmsnorm(h) * gamma
  float eps;
  bool h_settled;                // h may be read before the PDL wait (MoeExpertsParams::h_settled)
  float* x;                      // [batch][hidden], in place
  const int* ids;                // [batch][k]
  const float* weights;          // [batch][k]
  const int* slot_ids;           // optional [batch]; < 0: pad row
  int* error_flag;               // optional
  // Work list, activations and partial outputs (workspace).
  int* num_passes;               // [1]
  int4* passes;                  // [pass_capacity] {expert, first entry, entries, 0}, ascending expert
  int pass_capacity;
  int* entry_token;              // [max_entries]
  float* entry_weight;           // [max_entries]
  int* token_entries;            // [max_batch][k+S]: a token's entries in ascending expert id, -1 after the last
  int* chunk_done;               // [hidden/kDownRows] down items finished per row chunk
  char* act_in;                  // [max_batch][hidden_blocks][384]
  char* act_mid;                 // [max_entries][inter_blocks][384]
  float* y;                      // [max_entries][hidden] down outputs, unweighted
};

// Where a work list lives: the workspace (written by the prepare kernel) or a stream block's
// shared memory (built by the block itself).
struct WorkList {
  int* num_passes;     // [1]
  int4* passes;        // {expert, first entry, entries, 0}, ascending expert
  int* entry_token;    // [entries]
  float* entry_weight; // [entries]
  int* token_entries;  // [batch][k+S]: a token's entries in ascending expert id, -1 after the last
};
__host__ __device__ inline WorkList global_work_list(const ExpertsTileParams& p) {
  return {p.num_passes, p.passes, p.entry_token, p.entry_weight, p.token_entries};
}
// A list read by another kernel's blocks goes through L2 (ld.cg); a block's own list is shared memory.
template <class T>
__device__ __forceinline__ T load_list(const T* at) {
  return __isGlobal(at) ? __ldcg(at) : *at;
}

// ---- host-visible sizes ------------------------------------------------------------------------

__host__ __device__ inline int prepare_tiles(int max_batch) { return 1 + max_batch; }
__host__ __device__ inline int gate_up_row_groups(int inter) { return inter / kGateUpRows; }
__host__ __device__ inline int down_row_chunks(int hidden) { return hidden / kDownRows; }
// Down items: each pass's row chunks, or at one token (row sets) the shared experts' row chunks and
// then the row sets, each kRowSetRows rows of every routed entry.
__host__ __device__ inline int down_items(int passes, int num_shared, int hidden, bool row_sets) {
  return row_sets ? num_shared * down_row_chunks(hidden) + hidden / kRowSetRows : passes * down_row_chunks(hidden);
}
// Passes of a work list: each active expert's n entries in ceil(n / tokens_per_pass) runs, at most
// 1 + (n - 1) / tokens_per_pass, so all of them at most active + (entries - active) / tokens_per_pass.
__host__ __device__ inline int max_passes(int max_batch, int num_experts, int num_shared, int top_k, int tokens_per_pass) {
  const int active = (num_experts < max_batch * top_k ? num_experts : max_batch * top_k) + num_shared;
  const int entries = max_batch * (top_k + num_shared);
  return active + (entries - active) / tokens_per_pass;
}

struct PlanSmem {
  unsigned long long token_mask[kMaxPlanExperts];  // bit t: token t routed to the expert
  unsigned long long real_tokens;                  // bit t: token t is not a pad row
  int entry_offset[kMaxPlanExperts];
  int token_valid[ops::kMaxMoeBatch];              // routed slots of each token that count
  int ids[ops::kMaxMoeBatch * ops::kMaxMoeTopK];   // the routing, out-of-range ids as -1
  float weights[ops::kMaxMoeBatch * ops::kMaxMoeTopK];
  bool valid[ops::kMaxMoeBatch * ops::kMaxMoeTopK];
  typename cub::BlockScan<int, kBlockThreads>::TempStorage scan;
};
__host__ __device__ constexpr std::size_t prepare_smem_bytes() { return sizeof(PlanSmem); }


// ---- prepare ------------------------------------------------------------------------------------

// A slot counts when its token is not a pad row, its id is in range and not repeated earlier in
// the token (ids staged in shared memory). Bad ids of real tokens raise the error flag.
__device__ __forceinline__ bool slot_valid(const int* ids, int top_k, int token, int slot) {
  const int id = ids[token * top_k + slot];
  if (id < 0) return false;
  for (int j = 0; j < slot; ++j)
    if (ids[token * top_k + j] == id) return false;
  return true;
}

// One token (batch-1 decode): one warp ranks the token's valid ids with shuffles, no block scan.
// The same list as the general build: passes and entries in ascending expert id (each expert one
// pass of one entry), the shared experts after them. The caller passes a block barrier next.
__device__ inline void build_one_token_list(const ExpertsTileParams& p, const WorkList& out, bool report_errors) {
  static_assert(ops::kMaxMoeTopK <= 32 && ops::kMaxMoeTopK + ops::kMaxMoeShared <= 32);
  const int lane = threadIdx.x % 32, per_token = p.top_k + p.num_shared;
  const bool real = !device::is_pad_row(p.slot_ids, 0);
  int id = -1;
  float weight = 0.f;
  if (lane < p.top_k) {
    const int raw = __ldcg(p.ids + lane);
    weight = __ldcg(p.weights + lane);
    id = raw >= 0 && raw < p.num_experts ? raw : -1;
  }
  bool repeated = false;
  for (int j = 0; j < p.top_k; ++j) {
    const int other = __shfl_sync(0xFFFFFFFFu, id, j);
    repeated |= j < lane && other == id;
  }
  const bool valid = real && id >= 0 && !repeated;
  if (real && lane < p.top_k && !valid && report_errors && p.error_flag) *p.error_flag = 1;
  const unsigned valid_lanes = __ballot_sync(0xFFFFFFFFu, valid);
  int rank = 0;  // valid ids below this one (valid ids are distinct)
  for (int j = 0; j < p.top_k; ++j) {
    const int other = __shfl_sync(0xFFFFFFFFu, id, j);
    rank += (valid_lanes >> j & 1u) && other < id;
  }
  const int routed = __popc(valid_lanes), used = routed + (real ? p.num_shared : 0);
  auto add = [&](int expert, int pass, int entry, float w) {  // the expert's one pass; the token's place-th entry
    out.passes[pass] = make_int4(expert, entry, 1, 0);
    out.entry_token[entry] = 0;
    out.entry_weight[entry] = w;
    out.token_entries[pass] = entry;
  };
  if (valid) add(id, rank, rank, weight);
  if (real && lane < p.num_shared) add(p.num_experts + lane, routed + lane, p.top_k + lane, 1.f);
  if (lane >= used && lane < per_token) out.token_entries[lane] = -1;
  if (lane == 0) *out.num_passes = used;
}

// Any batch: per expert a token mask (shared-memory atomics), one block scan of the experts'
// entry and pass counts, then the entries. Ends with a block barrier.
__device__ inline void build_scanned_list(const ExpertsTileParams& p, const WorkList& out, PlanSmem& s, bool report_errors) {
  const int experts = p.num_experts + p.num_shared;
  const int per_token = p.top_k + p.num_shared;
  const int slots = p.batch * p.top_k;
  // Token t (< 64 <= the block's threads) is thread t's: its pad check loads with the ids.
  static_assert(ops::kMaxMoeBatch <= 64 && ops::kMaxMoeBatch <= kBlockThreads);
  const bool real_token = int(threadIdx.x) < p.batch && !device::is_pad_row(p.slot_ids, threadIdx.x);
  for (int i = threadIdx.x; i < slots; i += kBlockThreads) {  // one round trip up to 256 slots
    const int id = __ldcg(p.ids + i);
    s.weights[i] = __ldcg(p.weights + i);
    s.ids[i] = id >= 0 && id < p.num_experts ? id : -1;
  }
  // What needs none of the loads.
  for (int t = threadIdx.x; t < p.batch; t += kBlockThreads) s.token_valid[t] = 0;
  for (int e = threadIdx.x; e < p.num_experts; e += kBlockThreads) s.token_mask[e] = 0ull;
  for (int i = threadIdx.x; i < p.batch * per_token; i += kBlockThreads) out.token_entries[i] = -1;
  const unsigned real_bits = __ballot_sync(0xFFFFFFFFu, real_token);
  if (threadIdx.x % 32 == 0 && threadIdx.x < 64) reinterpret_cast<unsigned*>(&s.real_tokens)[threadIdx.x / 32] = real_bits;
  __syncthreads();
  const unsigned long long real_tokens = s.real_tokens;
  // (the shared experts' masks: no routed id reaches them, so no atomic below touches them)
  for (int e = p.num_experts + threadIdx.x; e < experts; e += kBlockThreads) s.token_mask[e] = real_tokens;
  for (int i = threadIdx.x; i < slots; i += kBlockThreads) {
    const int t = i / p.top_k;
    const bool valid = (real_tokens >> t & 1) && slot_valid(s.ids, p.top_k, t, i % p.top_k);
    s.valid[i] = valid;
    if (valid) {
      atomicOr(&s.token_mask[s.ids[i]], 1ull << t);  // integer OR: order-free, deterministic
      atomicAdd(&s.token_valid[t], 1);
    } else if ((real_tokens >> t & 1) && report_errors && p.error_flag) {
      *p.error_flag = 1;
    }
  }
  __syncthreads();

  // One exclusive scan of (passes << 16 | token count) gives each expert its first entry and its
  // first pass. Entries stay below 2^16 (64 tokens x 20), passes below 2^15.
  int packed[kPlanScanItems];
#pragma unroll
  for (int i = 0; i < kPlanScanItems; ++i) {
    const int e = threadIdx.x * kPlanScanItems + i;
    const int n = e < experts ? __popcll(s.token_mask[e]) : 0;
    packed[i] = (n + p.tokens_per_pass - 1) / p.tokens_per_pass << 16 | n;
  }
  int total = 0;
  cub::BlockScan<int, kBlockThreads>(s.scan).ExclusiveSum(packed, packed, total);
#pragma unroll
  for (int i = 0; i < kPlanScanItems; ++i) {
    const int e = threadIdx.x * kPlanScanItems + i;
    if (e >= experts) continue;
    const int n = __popcll(s.token_mask[e]);
    const int first = e < p.num_experts ? packed[i] & 0xFFFF : p.batch * p.top_k + (e - p.num_experts) * n;
    s.entry_offset[e] = first;
    for (int q = 0; q * p.tokens_per_pass < n; ++q)
      out.passes[(packed[i] >> 16) + q] = make_int4(e, first + q * p.tokens_per_pass, min(p.tokens_per_pass, n - q * p.tokens_per_pass), 0);
  }
  if (threadIdx.x == 0) *out.num_passes = total >> 16;
  __syncthreads();

  // Entry of (token t, expert e) = first entry of e + number of tokens below t routed to e; its
  // place in the token's list = number of the token's valid ids below e (ids are distinct).
  for (int i = threadIdx.x; i < slots; i += kBlockThreads) {
    if (!s.valid[i]) continue;
    const int t = i / p.top_k, id = s.ids[i];
    const int at = s.entry_offset[id] + __popcll(s.token_mask[id] & ((1ull << t) - 1));
    out.entry_token[at] = t;
    out.entry_weight[at] = s.weights[i];
    int rank = 0;
    for (int j = 0; j < p.top_k; ++j) rank += (s.valid[t * p.top_k + j] && s.ids[t * p.top_k + j] < id) ? 1 : 0;
    out.token_entries[t * per_token + rank] = at;
  }
  for (int i = threadIdx.x; i < p.num_shared * p.batch; i += kBlockThreads) {
    const int e = p.num_experts + i / p.batch, t = i % p.batch;
    if (!(real_tokens >> t & 1)) continue;
    const int at = s.entry_offset[e] + __popcll(real_tokens & ((1ull << t) - 1));
    out.entry_token[at] = t;
    out.entry_weight[at] = 1.f;
    out.token_entries[t * per_token + s.token_valid[t] + i / p.batch] = at;
  }
  __syncthreads();
}

// The work list of the routing (ids, weights, slot ids), into `out`: one token by a warp's shuffles,
// more by the block scan; both give the same list.
// The small-batch down kernel builds its list before its PDL wait, while the gate/up kernel still
// runs: the routing it reads is complete by then, but is read through L2 (ld.cg) all the same, so
// no stale L1 line can serve ids, weights or slot ids. Bad ids of real tokens raise the error flag
// when `report_errors`. Everything global is loaded in one round trip at the start (the build sits
// on the critical path of both small-batch stream kernels). Ends with a block barrier: the list is
// complete and `s` is free again.
__device__ inline void build_work_list(const ExpertsTileParams& p, const WorkList& out, PlanSmem& s, bool report_errors) {
  if (p.batch == 1) {  // the last warp: thread 0 may still be initialising the block's barriers
    if (threadIdx.x / 32 == kWarpsPerBlock - 1) build_one_token_list(p, out, report_errors);
    __syncthreads();
  } else {
    build_scanned_list(p, out, s, report_errors);
  }
}

// The shared experts' passes alone, from the slot ids (no routing): the entries build_work_list
// gives them, their passes renumbered from 0. For a gate/up stream of the shared experts that
// runs before the routing exists (StreamShape::set == ExpertSet::kShared). In-block lists only
// (batch <= kTokensPerPass: one ballot holds the batch). Ends with a block barrier.
__device__ inline void build_shared_list(const ExpertsTileParams& p, const WorkList& out) {
  static_assert(kTokensPerPass <= 32);
  const int lane = threadIdx.x % 32;
  const unsigned real = __ballot_sync(0xFFFFFFFFu, lane < p.batch && !device::is_pad_row(p.slot_ids, lane));
  const int n = __popc(real), per = (n + p.tokens_per_pass - 1) / p.tokens_per_pass;
  for (int i = threadIdx.x; i < p.num_shared * per; i += kBlockThreads) {
    const int s = i / per, q = i % per;
    out.passes[i] = make_int4(p.num_experts + s, p.batch * p.top_k + s * n + q * p.tokens_per_pass,
                              min(p.tokens_per_pass, n - q * p.tokens_per_pass), 0);
  }
  for (int i = threadIdx.x; i < p.num_shared * p.batch; i += kBlockThreads) {
    const int s = i / p.batch, t = i % p.batch;
    if (!(real >> t & 1u)) continue;
    const int at = p.batch * p.top_k + s * n + __popc(real & ((1u << t) - 1u));
    out.entry_token[at] = t;
    out.entry_weight[at] = 1.f;
  }
  if (threadIdx.x == 0) *out.num_passes = p.num_shared * per;
  __syncthreads();
}

// The down kernel's row-chunk counters start each step at zero (the combine also resets each
// one it used). Called by one block of the kernel before the down kernel.
__device__ inline void reset_chunk_counters(const ExpertsTileParams& p) {
  for (int c = threadIdx.x; c < down_row_chunks(p.hidden); c += kBlockThreads) p.chunk_done[c] = 0;
}

// Warp-wide: this lane's 8 values of 256-value block b of token t's input row.
__device__ __forceinline__ void load_h_values(const ExpertsTileParams& p, int t, int b, float (&v)[8]) {
  device::load_float8(p.h + std::int64_t(t) * p.hidden + b * 256 + threadIdx.x % 32 * 8, v);
}

// Warp-wide: a block's sum of squares (lane sums in index order, then a fixed butterfly).
__device__ __forceinline__ float block_sum_sq(const float (&v)[8]) {
  float sum_sq = 0.f;
#pragma unroll
  for (int i = 0; i < 8; ++i) sum_sq = fmaf(v[i], v[i], sum_sq);
  return device::warp_sum(sum_sq);
}

// Block-wide: the int8 activations of rows first_token.. first_token + tokens - 1 of h (or of
// rmsnorm(h) * gamma) into out[token][block] (kActBlockBytes each). The warps take the (token,
// block) units in turn; with the norm, each unit's sum of squares goes to `partial` (shared,
// tokens x hidden_blocks floats) and a token's is the sum of its blocks' in block order, so every
// caller gets the same 1/rms bit for bit. When every warp has at most kUnitsInRegisters units (one
// token), h and gamma load together once and stay in registers: one L2 round trip before the
// sums' barrier, where the general form reloads h and then waits for gamma after it.
__device__ inline void quantize_rows(const ExpertsTileParams& p, int first_token, int tokens, char* out, float* partial) {
  constexpr int kUnitsInRegisters = 2;
  const int units = tokens * p.hidden_blocks, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  auto scale = [&](int t, const float (&gv)[8], float (&v)[8]) {  // v *= gamma / rms of token t
    float sum_sq = 0.f;
    for (int k = 0; k < p.hidden_blocks; ++k) sum_sq += partial[t * p.hidden_blocks + k];
    const float inv_rms = rsqrtf(sum_sq / float(p.hidden) + p.eps);
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = v[i] * inv_rms * gv[i];
  };
  if (units <= kUnitsInRegisters * kWarpsPerBlock) {
    float v[kUnitsInRegisters][8], gv[kUnitsInRegisters][8];
#pragma unroll
    for (int j = 0; j < kUnitsInRegisters; ++j) {  // every load first, then the sums
      const int u = warp + j * kWarpsPerBlock;
      if (u >= units) continue;
      load_h_values(p, first_token + u / p.hidden_blocks, u % p.hidden_blocks, v[j]);
      if (p.gamma) device::ldg_float8(p.gamma + u % p.hidden_blocks * 256 + lane * 8, gv[j]);
    }
    if (p.gamma) {
#pragma unroll
      for (int j = 0; j < kUnitsInRegisters; ++j) {
        const int u = warp + j * kWarpsPerBlock;
        if (u >= units) continue;
        const float sum_sq = block_sum_sq(v[j]);
        if (lane == 0) partial[u] = sum_sq;
      }
      __syncthreads();
    }
#pragma unroll
    for (int j = 0; j < kUnitsInRegisters; ++j) {
      const int u = warp + j * kWarpsPerBlock;
      if (u >= units) continue;
      if (p.gamma) scale(u / p.hidden_blocks, gv[j], v[j]);
      q4k::quantize_act_block(v[j], out + std::int64_t(u) * q4k::kActBlockBytes);
    }
    return;
  }
  if (p.gamma) {
#pragma unroll 2
    for (int u = warp; u < units; u += kWarpsPerBlock) {
      float v[8];
      load_h_values(p, first_token + u / p.hidden_blocks, u % p.hidden_blocks, v);
      const float sum_sq = block_sum_sq(v);
      if (lane == 0) partial[u] = sum_sq;
    }
    __syncthreads();
  }
  for (int u = warp; u < units; u += kWarpsPerBlock) {
    const int t = u / p.hidden_blocks, b = u % p.hidden_blocks;
    float v[8];
    load_h_values(p, first_token + t, b, v);  // (its sum is in partial[])
    if (p.gamma) {
      float gv[8];
      device::ldg_float8(p.gamma + b * 256 + lane * 8, gv);
      scale(t, gv, v);
    }
    q4k::quantize_act_block(v, out + std::int64_t(u) * q4k::kActBlockBytes);
  }
}

__device__ inline void prepare_tile(const ExpertsTileParams& p, int tile, char* smem) {
  if (tile == 0) {
    reset_chunk_counters(p);
    build_work_list(p, global_work_list(p), *reinterpret_cast<PlanSmem*>(smem), true);
    return;
  }
  const int t = tile - 1;  // one token per tile
  if (t >= p.batch) return;
  quantize_rows(p, t, 1, p.act_in + std::int64_t(t) * p.hidden_blocks * q4k::kActBlockBytes, reinterpret_cast<float*>(smem));
}

// Bodies of the prepare stage (common/body.cuh). The standalone kernel runs prepare_tile's tiles;
// the megakernel runs the list and the quantised rows as two instructions, so the rows (which need
// only h) do not wait for the routing.
template <class Range, class Wait>
__device__ inline void prepare_body(const ExpertsTileParams& p, int tiles, const Range& r, char* smem, Wait& wait) {
  wait();
  for (int tile = r.first(); tile < tiles; tile += r.stride()) prepare_tile(p, tile, smem);
}
template <class Range, class Wait>
__device__ inline void work_list_body(const ExpertsTileParams& p, const Range& r, char* smem, Wait& wait) {
  wait();
  if (r.first() != 0) return;  // one tile
  reset_chunk_counters(p);
  build_work_list(p, global_work_list(p), *reinterpret_cast<PlanSmem*>(smem), true);
}
template <class Range, class Wait>
__device__ inline void quantize_body(const ExpertsTileParams& p, const Range& r, char* smem, Wait& wait) {
  wait();
  for (int t = r.first(); t < p.batch; t += r.stride()) {
    quantize_rows(p, t, 1, p.act_in + std::int64_t(t) * p.hidden_blocks * q4k::kActBlockBytes, reinterpret_cast<float*>(smem));
    __syncthreads();  // the row's partial sums are read before the next row writes them
  }
}
// Shared memory of quantize_body: the per-block sums of squares of one row.
__host__ __device__ inline std::size_t quantize_smem_bytes(int hidden) { return std::size_t(hidden / 256) * sizeof(float); }

}  // namespace encore::moe
