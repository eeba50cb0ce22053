// Device bodies of the expert stage (specs/moe.md §4-§7). Three stages per MoE layer:
//   prepare_tile : tile 0 builds the work list from ids[batch][k] (entries grouped by expert in
//                  ascending id, tokens ascending inside an expert, shared experts appended as
//                  always-on pseudo-experts of weight 1); tiles 1.. quantise h to the int8
//                  activation format of the Q4_K GEMVs (gemv/activation_q8.cuh).
//   gate_up_tile : item = (active expert, 32-row group): the 32 gate and 32 up rows are streamed
//                  once and applied to every token routed to the expert (8 at a time, activations
//                  staged in shared memory); silu(g)*u is quantised straight into the int8 format
//                  (one 32-value sub-block per token) for the down projection.
//   down_tile    : 8 output rows (one per warp) across all active experts in ascending id,
//                  shared last; per token acc += w * (W_down h) in that order, then x += acc.
//                  One owner per output element: no atomics, no combine stage.
// A (row, token) dot product runs the same code in the same order whatever the batch, so a
// token's output is bitwise independent of the other tokens.
#pragma once

#include <cstdint>

#include <cub/block/block_scan.cuh>

#include "common/launch.cuh"
#include "gemv/activation_q8.cuh"
#include "gemv/q4k_dot.cuh"

namespace encore::moe {

inline constexpr int kGateUpRowsPerItem = 32;                          // 8 warps x 4 groups, one row each
inline constexpr int kGateUpTokensPerPass = 8;
inline constexpr int kDownRowsPerTile = kWarpsPerBlock;                // one output row per warp
inline constexpr int kDownExpertsInFlight = 4;                         // experts' rows loaded ahead per warp
inline constexpr int kDownBlocksPerGroup = 2;                          // inter <= 4 groups x 2 blocks x 256
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
  int* error_flag;               // optional
  // Work list and activations (workspace).
  int* num_active;               // [1]
  int* active;                   // [E+S] expert ids, ascending
  int* offsets;                  // [E+S+1] entry ranges per active expert
  int* entry_token;              // [max_entries]
  float* entry_weight;           // [max_entries]
  char* act_in;                  // [max_batch][hidden_blocks][384]
  char* act_mid;                 // [max_entries][inter_blocks][384]
};

// ---- host-visible sizes ------------------------------------------------------------------------

__host__ __device__ inline int prepare_tiles(int max_batch, int hidden_blocks) {
  return 1 + (max_batch * hidden_blocks + kWarpsPerBlock - 1) / kWarpsPerBlock;
}
__host__ __device__ inline int gate_up_row_groups(int inter) { return inter / kGateUpRowsPerItem; }
__host__ __device__ inline int down_tiles(int hidden) { return hidden / kDownRowsPerTile; }

struct PlanSmem {
  unsigned long long token_mask[kMaxPlanExperts];  // bit t: token t routed to the expert
  int entry_offset[kMaxPlanExperts];
  typename cub::BlockScan<int, kBlockThreads>::TempStorage scan;
};
__host__ __device__ constexpr std::size_t prepare_smem_bytes() { return sizeof(PlanSmem); }
__host__ __device__ constexpr std::size_t gate_up_smem_bytes(int hidden_blocks) {
  return std::size_t(kGateUpTokensPerPass) * hidden_blocks * gemv::kActBlockBytes +
         kGateUpTokensPerPass * kGateUpRowsPerItem * sizeof(float);
}

// Pulls `bytes` (a multiple of 16, < 4 GB) at `ptr` (16-byte aligned) into L2.
__device__ __forceinline__ void prefetch_l2(const void* ptr, std::int64_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(ptr), "r"(std::uint32_t(bytes)) : "memory");
}

// ---- prepare ------------------------------------------------------------------------------------

// A slot counts when its id is in range and not repeated earlier in the token.
__device__ __forceinline__ bool slot_valid(const ExpertsTileParams& p, int token, int slot, int id) {
  if (id < 0 || id >= p.num_experts) return false;
  for (int j = 0; j < slot; ++j)
    if (p.ids[token * p.top_k + j] == id) return false;
  return true;
}

__device__ inline void build_work_list(const ExpertsTileParams& p, char* smem) {
  PlanSmem& s = *reinterpret_cast<PlanSmem*>(smem);
  const int experts = p.num_experts + p.num_shared;
  const unsigned long long all_tokens = p.batch >= 64 ? ~0ull : (1ull << p.batch) - 1;
  for (int e = threadIdx.x; e < experts; e += kBlockThreads) s.token_mask[e] = e >= p.num_experts ? all_tokens : 0ull;
  __syncthreads();
  const int slots = p.batch * p.top_k;
  for (int i = threadIdx.x; i < slots; i += kBlockThreads) {
    const int t = i / p.top_k, id = p.ids[i];
    if (slot_valid(p, t, i % p.top_k, id)) {
      atomicOr(&s.token_mask[id], 1ull << t);  // integer OR: order-free, deterministic
    } else if (p.error_flag) {
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

  // Entry of (token t, expert e) = first entry of e + number of tokens below t routed to e.
  for (int i = threadIdx.x; i < slots; i += kBlockThreads) {
    const int t = i / p.top_k, id = p.ids[i];
    if (!slot_valid(p, t, i % p.top_k, id)) continue;
    const int at = s.entry_offset[id] + __popcll(s.token_mask[id] & ((1ull << t) - 1));
    p.entry_token[at] = t;
    p.entry_weight[at] = p.weights[i];
  }
  for (int i = threadIdx.x; i < p.num_shared * p.batch; i += kBlockThreads) {
    const int at = s.entry_offset[p.num_experts + i / p.batch] + i % p.batch;
    p.entry_token[at] = i % p.batch;
    p.entry_weight[at] = 1.f;
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

// ---- gate/up ------------------------------------------------------------------------------------

// Quantises one 32-value sub-block `sub_block` (0..7) of a 256-value block into `out`, the same
// arithmetic and layout as gemv::quantize_act_block, with 4 lanes per sub-block (lane % 4 = which
// 8 values). All 32 lanes must call it (shuffles); `write` masks the stores.
__device__ __forceinline__ void quantize_act_sub_block(const float (&v)[8], int sub_block, bool write, char* out) {
  const int lane = threadIdx.x % 32;
  float amax = 0.f, sum = 0.f;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    amax = fmaxf(amax, fabsf(v[i]));
    sum += v[i];
  }
  amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, 1));
  amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, 2));
  const float partner_sum = __shfl_xor_sync(0xFFFFFFFFu, sum, 1);
  const float half_sum = (lane & 1) ? partner_sum + sum : sum + partner_sum;
  const float inv = amax > 0.f ? 127.f / amax : 0.f;
  const float d = amax / 127.f;
  if (!write) return;
  std::uint32_t packed[2] = {0u, 0u};
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int q = __float2int_rn(v[i] * inv);
    packed[i / 4] |= (std::uint32_t(q) & 0xFFu) << (8 * (i % 4));
  }
  const int pos = (lane % 4) * 8;
  const int chunk = 2 * (sub_block / 2) + pos / 16;
  const int half = sub_block % 2;
  *reinterpret_cast<uint2*>(out + half * 128 + chunk * 16 + pos % 16) = make_uint2(packed[0], packed[1]);
  float* meta = reinterpret_cast<float*>(out + 256);
  if ((lane & 1) == 0) meta[chunk * 4 + 2 + half] = half_sum;
  if ((lane & 3) == 0) {
    meta[(2 * (sub_block / 2)) * 4 + half] = d;
    meta[(2 * (sub_block / 2) + 1) * 4 + half] = d;
  }
}

__device__ inline void gate_up_tile(const ExpertsTileParams& p, int item, char* smem) {
  constexpr int kUnroll = 4;  // K blocks of both matrices in flight per lane
  const int row_groups = gate_up_row_groups(p.inter);
  const int num_active = *p.num_active;
  if (item >= num_active * row_groups) return;
  const int a = item / row_groups, row_group = item % row_groups;
  const int expert = p.active[a];
  const int first = p.offsets[a], end = p.offsets[a + 1];

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int chunk = lane % 8, group = lane / 8;
  const int row_in_item = warp * 4 + group;
  const std::int64_t row = std::int64_t(row_group) * kGateUpRowsPerItem + row_in_item;
  const char* w[2] = {p.gate + expert * p.up_matrix_bytes + row * p.up_row_bytes,
                      p.up + expert * p.up_matrix_bytes + row * p.up_row_bytes};
  const int hb = p.hidden_blocks;
  if (threadIdx.x < 2) {  // the item's 32 gate and 32 up rows are contiguous: one bulk L2 prefetch each
    const char* rows = (threadIdx.x == 0 ? p.gate : p.up) + expert * p.up_matrix_bytes +
                       std::int64_t(row_group) * kGateUpRowsPerItem * p.up_row_bytes;
    prefetch_l2(rows, kGateUpRowsPerItem * p.up_row_bytes);
  }
  char* act = smem;
  float* mid = reinterpret_cast<float*>(smem + std::size_t(kGateUpTokensPerPass) * hb * gemv::kActBlockBytes);  // [8][32]

  for (int pass = first; pass < end; pass += kGateUpTokensPerPass) {
    const int count = min(kGateUpTokensPerPass, end - pass);
    __syncthreads();  // the previous pass's readers are done
    const int words_per_token = hb * gemv::kActBlockBytes / 16;
    for (int i = threadIdx.x; i < count * words_per_token; i += kBlockThreads) {
      const int slot = i / words_per_token, word = i % words_per_token;
      const int token = p.entry_token[pass + slot];
      reinterpret_cast<uint4*>(act)[i] =
          reinterpret_cast<const uint4*>(p.act_in + std::int64_t(token) * hb * gemv::kActBlockBytes)[word];
    }
    __syncthreads();

    float acc[2][kGateUpTokensPerPass];
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int t = 0; t < kGateUpTokensPerPass; ++t) acc[m][t] = 0.f;
    for (int j0 = 0; j0 < hb; j0 += kUnroll) {
      gemv::LaneBlock blocks[kUnroll][2];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        if (j0 + u < hb)
#pragma unroll
          for (int m = 0; m < 2; ++m) blocks[u][m] = gemv::load_lane_block(w[m] + (j0 + u) * q4k::kBlockBytes, chunk);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int j = j0 + u;
        if (j >= hb) break;
#pragma unroll
        for (int m = 0; m < 2; ++m) {
          const gemv::LaneWeights lw = gemv::decode_lane_block(blocks[u][m], chunk);
#pragma unroll
          for (int t = 0; t < kGateUpTokensPerPass; ++t) {
            if (t >= count) break;
            acc[m][t] += gemv::lane_block_dot(
                lw, gemv::load_lane_activations(gemv::act_block(act + (std::size_t(t) * hb + j) * gemv::kActBlockBytes), chunk));
          }
        }
      }
    }
#pragma unroll
    for (int t = 0; t < kGateUpTokensPerPass; ++t) {
#pragma unroll
      for (int m = 0; m < 2; ++m) {
        float v = acc[m][t];
        v += __shfl_xor_sync(0xFFFFFFFFu, v, 1);
        v += __shfl_xor_sync(0xFFFFFFFFu, v, 2);
        v += __shfl_xor_sync(0xFFFFFFFFu, v, 4);
        acc[m][t] = v;
      }
      if (t < count && chunk == t) {
        const float g = acc[0][t], u = acc[1][t];
        mid[t * kGateUpRowsPerItem + row_in_item] = g / (1.f + expf(-g)) * u;
      }
    }
    __syncthreads();
    if (warp == 0) {  // lanes 4s..4s+3 quantise token slot s's 32 values
      const int slot = lane / 4;
      float v[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] = slot < count ? mid[slot * kGateUpRowsPerItem + (lane % 4) * 8 + i] : 0.f;
      // Rows 32*row_group.. are sub-block row_group % 8 of 256-value block row_group / 8.
      const std::int64_t entry = pass + slot;
      char* out = p.act_mid + (entry * p.inter_blocks + row_group / 8) * gemv::kActBlockBytes;
      quantize_act_sub_block(v, row_group % 8, slot < count, out);
    }
  }
}

// ---- down + combine -----------------------------------------------------------------------------

// Shared memory of the down stage: the work list (staged once per block) and a window of the
// int8 activations of the entries being processed (all 8 warps read the same entries).
inline constexpr int kDownStageBytes = 48 * 1024;
struct DownSmem {
  int* num_active;     // [1]
  int* active;         // [E+S]
  int* offsets;        // [E+S+1]
  int* entry_token;    // [max_entries]
  float* entry_weight; // [max_entries]
  char* act;           // [kDownStageBytes]
  __host__ __device__ DownSmem(char* base, int experts, int max_entries) {
    device::SmemAllocator alloc(base);
    num_active = alloc.take<int>(1);
    active = alloc.take<int>(experts);
    offsets = alloc.take<int>(experts + 1);
    entry_token = alloc.take<int>(max_entries);
    entry_weight = alloc.take<float>(max_entries);
    act = alloc.take<char>(kDownStageBytes);
    bytes = alloc.used();
  }
  std::size_t bytes;
};
__host__ __device__ inline std::size_t down_smem_bytes(int experts, int max_entries) {
  return DownSmem(nullptr, experts, max_entries).bytes;
}

__device__ inline void stage_work_list(const ExpertsTileParams& p, const DownSmem& s) {
  const int num_active = *p.num_active;
  const int entries = p.offsets[num_active];
  for (int i = threadIdx.x; i <= num_active; i += kBlockThreads) {
    if (i < num_active) s.active[i] = p.active[i];
    s.offsets[i] = p.offsets[i];
  }
  for (int i = threadIdx.x; i < entries; i += kBlockThreads) {
    s.entry_token[i] = p.entry_token[i];
    s.entry_weight[i] = p.entry_weight[i];
  }
  if (threadIdx.x == 0) *s.num_active = num_active;
  __syncthreads();
}

// 8 output rows (one per warp) across all active experts, ascending id (shared experts last):
// per token, acc += w * (W_down[e][row] . h_entry) in that order, then x[t][row] += acc.
__device__ inline void down_tile(const ExpertsTileParams& p, int tile, char* smem, int max_entries, bool& list_staged) {
  constexpr int kTok = 4;  // entries reduced together (independent butterflies)
  const DownSmem s(smem, p.num_experts + p.num_shared, max_entries);
  if (!list_staged) stage_work_list(p, s);
  list_staged = true;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int chunk = lane % 8, group = lane / 8;
  const std::int64_t row0 = std::int64_t(tile) * kDownRowsPerTile, row = row0 + warp;
  const int ib = p.inter_blocks;
  const int num_active = *s.num_active;
  const int entry_bytes = ib * gemv::kActBlockBytes;
  const int stage_entries = kDownStageBytes / entry_bytes;
  const std::int64_t tile_bytes = kDownRowsPerTile * p.down_row_bytes;  // the tile's rows of one expert
  constexpr int kLookahead = 2 * kDownExpertsInFlight;
  if (threadIdx.x < kLookahead && int(threadIdx.x) < num_active)
    prefetch_l2(p.down + s.active[threadIdx.x] * p.down_matrix_bytes + row0 * p.down_row_bytes, tile_bytes);
  float acc_lo = 0.f, acc_hi = 0.f;  // tokens lane and lane + 32

  for (int a0 = 0; a0 < num_active; a0 += kDownExpertsInFlight) {
    const int ahead = a0 + kLookahead + int(threadIdx.x);
    if (threadIdx.x < kDownExpertsInFlight && ahead < num_active)
      prefetch_l2(p.down + s.active[ahead] * p.down_matrix_bytes + row0 * p.down_row_bytes, tile_bytes);
    gemv::LaneBlock blocks[kDownExpertsInFlight][kDownBlocksPerGroup];
#pragma unroll
    for (int u = 0; u < kDownExpertsInFlight; ++u) {
      if (a0 + u >= num_active) break;
      const char* base = p.down + s.active[a0 + u] * p.down_matrix_bytes + row * p.down_row_bytes;
#pragma unroll
      for (int jj = 0; jj < kDownBlocksPerGroup; ++jj) {
        const int j = group + 4 * jj;
        if (j < ib) blocks[u][jj] = gemv::load_lane_block(base + j * q4k::kBlockBytes, chunk);
      }
    }
    const int a_end = min(a0 + kDownExpertsInFlight, num_active);
    const int first = s.offsets[a0], last = s.offsets[a_end];
    for (int c0 = first; c0 < last; c0 += stage_entries) {
      const int c1 = min(last, c0 + stage_entries);
      __syncthreads();  // the previous window's readers are done
      const uint4* src = reinterpret_cast<const uint4*>(p.act_mid + std::int64_t(c0) * entry_bytes);
      for (int i = threadIdx.x; i < (c1 - c0) * entry_bytes / 16; i += kBlockThreads) reinterpret_cast<uint4*>(s.act)[i] = src[i];
      __syncthreads();
#pragma unroll
      for (int u = 0; u < kDownExpertsInFlight; ++u) {
        const int a = a0 + u;
        if (a >= a_end) break;
        gemv::LaneWeights lw[kDownBlocksPerGroup];
#pragma unroll
        for (int jj = 0; jj < kDownBlocksPerGroup; ++jj)
          if (group + 4 * jj < ib) lw[jj] = gemv::decode_lane_block(blocks[u][jj], chunk);
        const int e_end = min(s.offsets[a + 1], c1);
        for (int n0 = max(s.offsets[a], c0); n0 < e_end; n0 += kTok) {
          float part[kTok];
#pragma unroll
          for (int q = 0; q < kTok; ++q) {
            part[q] = 0.f;
            if (n0 + q >= e_end) continue;
#pragma unroll
            for (int jj = 0; jj < kDownBlocksPerGroup; ++jj) {
              const int j = group + 4 * jj;
              if (j < ib)
                part[q] += gemv::lane_block_dot(
                    lw[jj], gemv::load_lane_activations(gemv::act_block(s.act + (n0 + q - c0) * entry_bytes + j * gemv::kActBlockBytes), chunk));
            }
          }
#pragma unroll
          for (int offset = 1; offset < 32; offset <<= 1)
#pragma unroll
            for (int q = 0; q < kTok; ++q) part[q] += __shfl_xor_sync(0xFFFFFFFFu, part[q], offset);
#pragma unroll
          for (int q = 0; q < kTok; ++q) {
            if (n0 + q >= e_end) break;
            const int t = s.entry_token[n0 + q];
            const float contribution = s.entry_weight[n0 + q] * part[q];
            if (t == lane) acc_lo += contribution;
            if (t == lane + 32) acc_hi += contribution;
          }
        }
      }
    }
  }
  if (lane < p.batch) p.x[std::int64_t(lane) * p.hidden + row] += acc_lo;
  if (lane + 32 < p.batch) p.x[std::int64_t(lane + 32) * p.hidden + row] += acc_hi;
}

}  // namespace encore::moe
