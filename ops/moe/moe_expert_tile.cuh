// Device bodies of the expert stage (specs/moe.md §4-§7). Three stages per MoE layer:
//   prepare_tile : tile 0 builds the work list from ids[batch][k] (entries grouped by expert in
//                  ascending id, tokens ascending inside an expert, shared experts appended as
//                  always-on pseudo-experts of weight 1; pad rows left out) and, per token, its
//                  entries in ascending expert id; tiles 1.. quantise h to the int8 activation
//                  format of the Q4_K GEMVs (gemv/activation_q8.cuh).
//   gate_up_item : item = (active expert, 32-row group): the 32 gate and 32 up rows are streamed
//                  once for every token routed to the expert (8 at a time, activations staged in
//                  shared memory); silu(g)*u is quantised into the int8 format (one 32-value
//                  sub-block per token) for the down projection.
//   down_item    : item = (active expert, 32 output rows): the rows are streamed once for all the
//                  expert's entries, y[entry][row] = W_down[row] . mid[entry]. The last item of a
//                  row chunk to finish (an integer counter) combines it: per token, in ascending
//                  expert id (shared last), x[t][row] += sum_j w_j * y[entry_j][row]. One owner
//                  per output element, no float atomics.
// Items are short (one expert's 32 rows) and the Q4_K decode + dot costs instructions per weight
// byte, so the kernels favour warps per SM: several blocks per SM, each lane's next K blocks kept
// in flight in registers, the first loads issued before the item's activations are staged.
// A (row, token) dot product runs the same code in the same order whatever the batch, so a
// token's output is bitwise independent of the other tokens.
#pragma once

#include <cstdint>

#include <cub/block/block_scan.cuh>

#include "common/launch.cuh"
#include "gemv/activation_q8.cuh"
#include "gemv/q4k_dot.cuh"

namespace encore::moe {

inline constexpr int kRowsPerItem = 32;                  // 8 warps x 4 lane groups, one row each
inline constexpr int kTokensPerPass = 8;                 // tokens (entries) whose activations are staged together
// Blocks per SM of the gate/up and down kernels (compile-time tuning; H200 A/B in bench/RESULTS.md).
// The bodies are bound by round trips per item, so more resident blocks keep more items going;
// the register cap (65536 / (256 x blocks)) limits the K blocks each lane keeps in flight.
#ifndef ENCORE_MOE_GATE_UP_BLOCKS_PER_SM
#define ENCORE_MOE_GATE_UP_BLOCKS_PER_SM 3
#endif
#ifndef ENCORE_MOE_DOWN_BLOCKS_PER_SM
#define ENCORE_MOE_DOWN_BLOCKS_PER_SM 3
#endif
inline constexpr int kGateUpBlocksPerSm = ENCORE_MOE_GATE_UP_BLOCKS_PER_SM;
inline constexpr int kDownBlocksPerSm = ENCORE_MOE_DOWN_BLOCKS_PER_SM;
inline constexpr int kGateUpUnroll = kGateUpBlocksPerSm >= 4 ? 1 : 2;  // K blocks of gate and up in flight per lane
inline constexpr int kDownUnroll = 4;                                   // K blocks of a down row in flight per lane
inline constexpr int kMaxPlanExperts = ops::kMaxMoeExperts + ops::kMaxMoeShared;
inline constexpr int kPlanScanItems = (kMaxPlanExperts + kBlockThreads - 1) / kBlockThreads;

struct ExpertsTileParams {
  const char* gate;              // [E+S][inter][hidden/256] Q4_K
  const char* up;
  const char* down;              // [E+S][hidden][inter/256] Q4_K
  std::int64_t up_matrix_bytes;  // inter * hidden/256 * 144
  std::int64_t down_matrix_bytes;
  std::int64_t up_row_bytes;     // hidden/256 * 144
  std::int64_t down_row_bytes;   // inter/256 * 144
  int num_experts, num_shared, top_k;
  int hidden, inter;
  int hidden_blocks, inter_blocks;  // hidden/256, inter/256
  int batch;
  const float* h;                // [batch][hidden]
  float* x;                      // [batch][hidden], in place
  const int* ids;                // [batch][k]
  const float* weights;          // [batch][k]
  const int* slot_ids;           // optional [batch]; < 0: pad row
  int* error_flag;               // optional
  int prefetch_slots;            // routing slots whose experts the prepare kernel pulls into L2 (0: none)
  bool prefetch_shared;          // the prepare kernel pulls the shared experts into L2 before the PDL wait
  // Work list, activations and partial outputs (workspace).
  int* num_active;               // [1]
  int* active;                   // [E+S] expert ids, ascending
  int* offsets;                  // [E+S+1] entry ranges per active expert
  int* entry_token;              // [max_entries]
  float* entry_weight;           // [max_entries]
  int* token_entries;            // [max_batch][k+S]: a token's entries in ascending expert id, -1 after the last
  int* chunk_done;               // [hidden/32] down items finished per row chunk
  char* act_in;                  // [max_batch][hidden_blocks][384]
  char* act_mid;                 // [max_entries][inter_blocks][384]
  float* y;                      // [max_entries][hidden] down outputs, unweighted
};

// ---- host-visible sizes ------------------------------------------------------------------------

__host__ __device__ inline int prepare_tiles(int max_batch, int hidden_blocks) {
  return 1 + (max_batch * hidden_blocks + kWarpsPerBlock - 1) / kWarpsPerBlock;
}
__host__ __device__ inline int gate_up_row_groups(int inter) { return inter / kRowsPerItem; }
__host__ __device__ inline int down_row_chunks(int hidden) { return hidden / kRowsPerItem; }

struct PlanSmem {
  unsigned long long token_mask[kMaxPlanExperts];  // bit t: token t routed to the expert
  unsigned long long real_tokens;                  // bit t: token t is not a pad row
  int entry_offset[kMaxPlanExperts];
  int token_valid[ops::kMaxMoeBatch];              // routed slots of each token that count
  int ids[ops::kMaxMoeBatch * ops::kMaxMoeTopK];   // the routing, out-of-range ids as -1
  bool valid[ops::kMaxMoeBatch * ops::kMaxMoeTopK];
  typename cub::BlockScan<int, kBlockThreads>::TempStorage scan;
};
__host__ __device__ constexpr std::size_t prepare_smem_bytes() { return sizeof(PlanSmem); }

// Shared memory of a gate/up or down item: staged activations of kTokensPerPass tokens, then
// (gate/up) silu(g)*u of the item's 32 rows per token and one 384-byte quantiser block per warp.
__host__ __device__ constexpr std::size_t act_stage_bytes(int k_blocks) {
  return std::size_t(kTokensPerPass) * k_blocks * gemv::kActBlockBytes;
}
__host__ __device__ constexpr std::size_t gate_up_smem_bytes(int hidden_blocks) {
  return act_stage_bytes(hidden_blocks) + kTokensPerPass * kRowsPerItem * sizeof(float) +
         std::size_t(kWarpsPerBlock) * gemv::kActBlockBytes;
}
__host__ __device__ constexpr std::size_t down_smem_bytes(int inter_blocks) { return act_stage_bytes(inter_blocks); }

// Pulls `bytes` (a multiple of 16, < 4 GB) at `ptr` (16-byte aligned) into L2.
__device__ __forceinline__ void prefetch_l2(const void* ptr, std::int64_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(ptr), "r"(std::uint32_t(bytes)) : "memory");
}

__device__ __forceinline__ bool pad_row(const ExpertsTileParams& p, int token) { return p.slot_ids && p.slot_ids[token] < 0; }

// ---- L2 prefetch of whole experts (prepare kernel) ---------------------------------------------

// Compile-time tuning switch, off: measured slower on the H200 (bench/RESULTS.md).
//   ENCORE_MOE_PREPARE_PREFETCH  the prepare kernel pulls the shared experts (before the PDL wait)
//                                and, at few routing slots, the routed experts into L2 (B = 1 +2 us).
// (Per-item L2 prefetches of the gate/up and down rows were measured slower too and removed.)
#ifndef ENCORE_MOE_PREPARE_PREFETCH
#define ENCORE_MOE_PREPARE_PREFETCH 0
#endif
inline constexpr bool kPreparePrefetch = ENCORE_MOE_PREPARE_PREFETCH != 0;

inline constexpr int kPrefetchChunkBytes = 32 * 1024;
// Routed experts are prefetched only when the step routes at most this many slots: 16 Kimi experts
// (3.98 MB each) plus the shared one stay below the 60 MB L2; more would evict each other.
inline constexpr int kPrefetchMaxSlots = 16;

// Pulls the gate and up matrices of experts expert_of(0 .. count-1), then their down matrices,
// into L2 in kPrefetchChunkBytes pieces: piece u goes to block u % gridDim.x (bulk prefetches are
// queued per SM, so they are spread over every block, gate/up first). Out-of-range ids (-1: pad
// rows, bad ids) are skipped.
template <class ExpertOf>
__device__ inline void prefetch_experts(const ExpertsTileParams& p, int count, ExpertOf expert_of) {
  const std::int64_t matrix_bytes = p.up_matrix_bytes;  // gate, up and down matrices are alike in size
  const int chunks = int((matrix_bytes + kPrefetchChunkBytes - 1) / kPrefetchChunkBytes);
  const int units = count * 3 * chunks;
  for (int u = threadIdx.x * gridDim.x + blockIdx.x; u < units; u += gridDim.x * kBlockThreads) {
    const int c = u % chunks, e = expert_of(u / chunks % count), m = u / chunks / count;
    if (e < 0 || e >= p.num_experts + p.num_shared) continue;
    const char* base = (m == 0 ? p.gate : m == 1 ? p.up : p.down) + e * matrix_bytes;
    const std::int64_t at = std::int64_t(c) * kPrefetchChunkBytes;
    prefetch_l2(base + at, min(std::int64_t(kPrefetchChunkBytes), matrix_bytes - at));
  }
}

// ---- prepare ------------------------------------------------------------------------------------

// A slot counts when its token is not a pad row, its id is in range and not repeated earlier in
// the token. Bad ids of real tokens raise the error flag.
// A slot counts when its token is not a pad row, its id is in range and not repeated earlier in
// the token (ids staged in shared memory). Bad ids of real tokens raise the error flag.
__device__ __forceinline__ bool slot_valid(const int* ids, int top_k, int token, int slot) {
  const int id = ids[token * top_k + slot];
  if (id < 0) return false;
  for (int j = 0; j < slot; ++j)
    if (ids[token * top_k + j] == id) return false;
  return true;
}

__device__ inline void build_work_list(const ExpertsTileParams& p, char* smem) {
  PlanSmem& s = *reinterpret_cast<PlanSmem*>(smem);
  const int experts = p.num_experts + p.num_shared;
  const int per_token = p.top_k + p.num_shared;
  const int slots = p.batch * p.top_k;
  if (threadIdx.x == 0) s.real_tokens = 0ull;
  for (int t = threadIdx.x; t < p.batch; t += kBlockThreads) s.token_valid[t] = 0;
  for (int i = threadIdx.x; i < slots; i += kBlockThreads) {
    const int id = p.ids[i];
    s.ids[i] = id >= 0 && id < p.num_experts ? id : -1;
  }
  for (int c = threadIdx.x; c < down_row_chunks(p.hidden); c += kBlockThreads) p.chunk_done[c] = 0;
  __syncthreads();
  for (int t = threadIdx.x; t < p.batch; t += kBlockThreads)
    if (!pad_row(p, t)) atomicOr(&s.real_tokens, 1ull << t);
  __syncthreads();
  const unsigned long long real_tokens = s.real_tokens;
  for (int e = threadIdx.x; e < experts; e += kBlockThreads) s.token_mask[e] = e >= p.num_experts ? real_tokens : 0ull;
  __syncthreads();
  for (int i = threadIdx.x; i < slots; i += kBlockThreads) {
    const int t = i / p.top_k;
    const bool valid = (real_tokens >> t & 1) && slot_valid(s.ids, p.top_k, t, i % p.top_k);
    s.valid[i] = valid;
    if (valid) {
      atomicOr(&s.token_mask[s.ids[i]], 1ull << t);  // integer OR: order-free, deterministic
      atomicAdd(&s.token_valid[t], 1);
    } else if ((real_tokens >> t & 1) && p.error_flag) {
      *p.error_flag = 1;
    }
  }
  __syncthreads();

  // One exclusive scan of (active flag << 16 | token count) gives each expert its slot in active[]
  // and its first entry. Counts stay below 2^16 (64 tokens x 20 entries).
  int packed[kPlanScanItems];
#pragma unroll
  for (int i = 0; i < kPlanScanItems; ++i) {
    const int e = threadIdx.x * kPlanScanItems + i;
    const int n = e < experts ? __popcll(s.token_mask[e]) : 0;
    packed[i] = n > 0 ? (1 << 16) | n : 0;
  }
  int total = 0;
  cub::BlockScan<int, kBlockThreads>(s.scan).ExclusiveSum(packed, packed, total);
#pragma unroll
  for (int i = 0; i < kPlanScanItems; ++i) {
    const int e = threadIdx.x * kPlanScanItems + i;
    if (e >= experts) continue;
    s.entry_offset[e] = packed[i] & 0xFFFF;
    if (s.token_mask[e] != 0ull) {
      p.active[packed[i] >> 16] = e;
      p.offsets[packed[i] >> 16] = packed[i] & 0xFFFF;
    }
  }
  if (threadIdx.x == 0) {
    *p.num_active = total >> 16;
    p.offsets[total >> 16] = total & 0xFFFF;
  }
  __syncthreads();

  // Entry of (token t, expert e) = first entry of e + number of tokens below t routed to e; its
  // place in the token's list = number of the token's valid ids below e (ids are distinct).
  for (int i = threadIdx.x; i < p.batch * per_token; i += kBlockThreads) p.token_entries[i] = -1;
  __syncthreads();
  for (int i = threadIdx.x; i < slots; i += kBlockThreads) {
    if (!s.valid[i]) continue;
    const int t = i / p.top_k, id = s.ids[i];
    const int at = s.entry_offset[id] + __popcll(s.token_mask[id] & ((1ull << t) - 1));
    p.entry_token[at] = t;
    p.entry_weight[at] = p.weights[i];
    int rank = 0;
    for (int j = 0; j < p.top_k; ++j) rank += (s.valid[t * p.top_k + j] && s.ids[t * p.top_k + j] < id) ? 1 : 0;
    p.token_entries[t * per_token + rank] = at;
  }
  for (int i = threadIdx.x; i < p.num_shared * p.batch; i += kBlockThreads) {
    const int e = p.num_experts + i / p.batch, t = i % p.batch;
    if (!(real_tokens >> t & 1)) continue;
    const int at = s.entry_offset[e] + __popcll(real_tokens & ((1ull << t) - 1));
    p.entry_token[at] = t;
    p.entry_weight[at] = 1.f;
    p.token_entries[t * per_token + s.token_valid[t] + i / p.batch] = at;
  }
}

__device__ inline void prepare_tile(const ExpertsTileParams& p, int tile, char* smem) {
  if (tile == 0) {
    build_work_list(p, smem);
    return;
  }
  const int unit = (tile - 1) * kWarpsPerBlock + threadIdx.x / 32;  // (token, 256-value block)
  if (unit >= p.batch * p.hidden_blocks) return;
  const int t = unit / p.hidden_blocks, b = unit % p.hidden_blocks;
  const float4* src = reinterpret_cast<const float4*>(p.h + std::int64_t(t) * p.hidden + b * 256 + (threadIdx.x % 32) * 8);
  const float4 a = src[0], c = src[1];
  const float v[8] = {a.x, a.y, a.z, a.w, c.x, c.y, c.z, c.w};
  gemv::quantize_act_block(v, p.act_in + std::int64_t(unit) * gemv::kActBlockBytes);
}

// ---- shared streaming loop ----------------------------------------------------------------------

// Copies the activations of `count` tokens (k_blocks x 384 bytes each, token i at src(i)) into
// shared memory. Callers synchronise around it.
template <class Source>
__device__ __forceinline__ void stage_activations(char* act, int k_blocks, int count, Source src) {
  const int words_per_token = k_blocks * gemv::kActBlockBytes / 16;
  for (int i = threadIdx.x; i < count * words_per_token; i += kBlockThreads)
    reinterpret_cast<uint4*>(act)[i] = reinterpret_cast<const uint4*>(src(i / words_per_token))[i % words_per_token];
}

// kUnroll consecutive K blocks (from j0) of this lane's rows of kMats matrices; blocks past
// k_blocks are left unloaded.
template <int kMats, int kUnroll>
struct RowBlocks {
  gemv::LaneBlock b[kUnroll][kMats];
};

template <int kMats, int kUnroll>
__device__ __forceinline__ void load_row_blocks(const char* const (&w)[kMats], int k_blocks, int j0, int chunk,
                                                RowBlocks<kMats, kUnroll>& blocks) {
#pragma unroll
  for (int u = 0; u < kUnroll; ++u)
    if (j0 + u < k_blocks)
#pragma unroll
      for (int m = 0; m < kMats; ++m) blocks.b[u][m] = gemv::load_lane_block(w[m] + (j0 + u) * q4k::kBlockBytes, chunk);
}

// This lane's row . act[t] for kMats matrices (rows at w[m], k_blocks Q4_K blocks each) and
// `count` staged tokens, reduced over the 8-lane group: lane `chunk` covers qs chunk `chunk` of
// every block. `blocks` holds K blocks 0..kUnroll-1 on entry (the caller issues those loads before
// it stages the activations, so they overlap that round trip); the next kUnroll blocks are loaded
// as soon as the current ones are decoded.
template <int kMats, int kUnroll>
__device__ __forceinline__ void rows_dot_tokens(const char* const (&w)[kMats], int k_blocks, const char* act, int count,
                                                int chunk, RowBlocks<kMats, kUnroll>& blocks,
                                                float (&acc)[kMats][kTokensPerPass]) {
#pragma unroll
  for (int m = 0; m < kMats; ++m)
#pragma unroll
    for (int t = 0; t < kTokensPerPass; ++t) acc[m][t] = 0.f;
  for (int j0 = 0; j0 < k_blocks; j0 += kUnroll) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int j = j0 + u;
      if (j >= k_blocks) break;
#pragma unroll
      for (int m = 0; m < kMats; ++m) {
        const gemv::LaneWeights lw = gemv::decode_lane_block(blocks.b[u][m], chunk);
#pragma unroll
        for (int t = 0; t < kTokensPerPass; ++t) {
          if (t >= count) break;
          acc[m][t] += gemv::lane_block_dot(
              lw, gemv::load_lane_activations(gemv::act_block(act + (std::size_t(t) * k_blocks + j) * gemv::kActBlockBytes), chunk));
        }
      }
    }
    load_row_blocks(w, k_blocks, j0 + kUnroll, chunk, blocks);
  }
#pragma unroll
  for (int m = 0; m < kMats; ++m)
#pragma unroll
    for (int t = 0; t < kTokensPerPass; ++t) {
      float v = acc[m][t];
      v += __shfl_xor_sync(0xFFFFFFFFu, v, 1);
      v += __shfl_xor_sync(0xFFFFFFFFu, v, 2);
      v += __shfl_xor_sync(0xFFFFFFFFu, v, 4);
      acc[m][t] = v;
    }
}

// ---- gate/up ------------------------------------------------------------------------------------

// Quantises the 32 values mid[0..31] as sub-block `sub_block` of a 256-value block and writes only
// that sub-block's codes and meta to `out`. gemv::quantize_act_block does the arithmetic on a
// per-warp scratch block (the lanes of the other sub-blocks hold zeros; sub-blocks are
// independent); the copy follows the layout documented in gemv/activation_q8.cuh: the sub-block's
// 32 codes are contiguous at half*128 + 32*(sub_block/2), its {d, sum} at meta[c].{x|y, z|w} of
// chunks c = 2*(sub_block/2) + {0, 1}. Whole warp.
__device__ __forceinline__ void quantize_sub_block(const float* mid, int sub_block, char* scratch, char* out) {
  const int lane = threadIdx.x % 32;
  float v[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) v[i] = lane / 4 == sub_block ? mid[(lane % 4) * 8 + i] : 0.f;
  gemv::quantize_act_block(v, scratch);
  __syncwarp();
  const int half = sub_block % 2, pair = sub_block / 2;
  if (lane < 8) {
    const int at = half * 128 + pair * 32 + lane * 4;
    *reinterpret_cast<std::uint32_t*>(out + at) = *reinterpret_cast<const std::uint32_t*>(scratch + at);
  } else if (lane < 12) {
    const int q = lane - 8;  // chunk 2*pair + q/2; field d (q even) or sum (q odd) of this half
    const int at = 256 + ((2 * pair + q / 2) * 4 + (q % 2) * 2 + half) * 4;
    *reinterpret_cast<float*>(out + at) = *reinterpret_cast<const float*>(scratch + at);
  }
  __syncwarp();
}

// Item = (active expert, 32-row group). `smem`: activations, silu(g)*u, the quantiser scratch.
// kUnroll: K blocks of both matrices loaded together per lane; the first of them are requested
// before the activations are staged (they depend on the expert id alone).
template <int kUnroll>
__device__ inline void gate_up_item(const ExpertsTileParams& p, int item, char* smem) {
  const int row_groups = gate_up_row_groups(p.inter);
  const int a = item / row_groups, row_group = item % row_groups;
  const int expert = p.active[a];
  const int first = p.offsets[a], end = p.offsets[a + 1];

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int chunk = lane % 8, row_in_item = warp * 4 + lane / 8;
  const std::int64_t row = std::int64_t(row_group) * kRowsPerItem + row_in_item;
  const char* const w[2] = {p.gate + expert * p.up_matrix_bytes + row * p.up_row_bytes,
                            p.up + expert * p.up_matrix_bytes + row * p.up_row_bytes};
  const int hb = p.hidden_blocks;
  char* act = smem;
  float* mid = reinterpret_cast<float*>(smem + act_stage_bytes(hb));                       // [8][32]
  char* scratch = smem + act_stage_bytes(hb) + kTokensPerPass * kRowsPerItem * sizeof(float) + warp * gemv::kActBlockBytes;

  for (int pass = first; pass < end; pass += kTokensPerPass) {
    const int count = min(kTokensPerPass, end - pass);
    RowBlocks<2, kUnroll> blocks;
    load_row_blocks(w, hb, 0, chunk, blocks);
    __syncthreads();  // the previous pass's (or item's) readers are done
    stage_activations(act, hb, count, [&](int i) {
      return p.act_in + std::int64_t(p.entry_token[pass + i]) * hb * gemv::kActBlockBytes;
    });
    __syncthreads();
    float acc[2][kTokensPerPass];
    rows_dot_tokens<2, kUnroll>(w, hb, act, count, chunk, blocks, acc);
#pragma unroll
    for (int t = 0; t < kTokensPerPass; ++t)
      if (t < count && chunk == t) {
        const float g = acc[0][t], u = acc[1][t];
        mid[t * kRowsPerItem + row_in_item] = g / (1.f + expf(-g)) * u;
      }
    __syncthreads();
    // Warp t quantises token slot t's 32 values: rows 32*row_group.. are sub-block row_group % 8
    // of 256-value block row_group / 8 of the entry's activations.
    if (warp < count)
      quantize_sub_block(mid + warp * kRowsPerItem, row_group % 8, scratch,
                         p.act_mid + ((pass + warp) * std::int64_t(p.inter_blocks) + row_group / 8) * gemv::kActBlockBytes);
  }
}

// ---- down + combine -----------------------------------------------------------------------------

// x[t][row] += sum over the token's entries (ascending expert id, shared last) of w * y, for the
// 32 rows of `chunk_index`. y comes from other blocks: read through L2 (ld.global.cg).
__device__ inline void combine_chunk(const ExpertsTileParams& p, int chunk_index) {
  const int per_token = p.top_k + p.num_shared;
  for (int i = threadIdx.x; i < p.batch * kRowsPerItem; i += kBlockThreads) {
    const int t = i / kRowsPerItem;
    if (pad_row(p, t)) continue;
    const std::int64_t row = std::int64_t(chunk_index) * kRowsPerItem + i % kRowsPerItem;
    float acc = 0.f;
    for (int j = 0; j < per_token; ++j) {
      const int entry = p.token_entries[t * per_token + j];
      if (entry < 0) break;
      acc += p.entry_weight[entry] * __ldcg(p.y + entry * std::int64_t(p.hidden) + row);
    }
    p.x[t * std::int64_t(p.hidden) + row] += acc;
  }
}

// Item = (active expert, 32 output rows); the first weight loads go out before the staging, as in
// gate_up_item.
__device__ inline void down_item(const ExpertsTileParams& p, int item, int num_active, char* smem) {
  const int chunks = down_row_chunks(p.hidden);
  const int a = item / chunks, chunk_index = item % chunks;
  const int expert = p.active[a];
  const int first = p.offsets[a], end = p.offsets[a + 1];

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int chunk = lane % 8, row_in_item = warp * 4 + lane / 8;
  const std::int64_t row = std::int64_t(chunk_index) * kRowsPerItem + row_in_item;
  const char* const w[1] = {p.down + expert * p.down_matrix_bytes + row * p.down_row_bytes};
  const int ib = p.inter_blocks;
  for (int pass = first; pass < end; pass += kTokensPerPass) {
    const int count = min(kTokensPerPass, end - pass);
    RowBlocks<1, kDownUnroll> blocks;
    load_row_blocks(w, ib, 0, chunk, blocks);
    __syncthreads();
    stage_activations(smem, ib, count, [&](int i) { return p.act_mid + std::int64_t(pass + i) * ib * gemv::kActBlockBytes; });
    __syncthreads();
    float acc[1][kTokensPerPass];
    rows_dot_tokens<1, kDownUnroll>(w, ib, smem, count, chunk, blocks, acc);
#pragma unroll
    for (int t = 0; t < kTokensPerPass; ++t)
      if (t < count && chunk == t) p.y[(pass + t) * std::int64_t(p.hidden) + row] = acc[0][t];
  }

  // The last of the chunk's num_active items combines it (release: fence before the count;
  // acquire: fence after reading the final count).
  __shared__ int last;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    last = atomicAdd(p.chunk_done + chunk_index, 1) == num_active - 1;
    if (last) __threadfence();
  }
  __syncthreads();
  if (last) {
    combine_chunk(p, chunk_index);
    if (threadIdx.x == 0) p.chunk_done[chunk_index] = 0;  // ready for the next step
  }
}

}  // namespace encore::moe
