// Device bodies of MoE routing (docs/moe.md §2):
//   router_gemv_tile : logits = W_g h for 8 experts (one per warp) over one K slice, all tokens;
//                      partial sums per slice, added in slice order by the top-k (deterministic).
//                      With a fused RMSNorm the rows are W_g * gamma and the tiles of experts
//                      0..7 also leave each slice's sum of h^2; the top-k scales the logits by
//                      1 / rms (W_g (gamma * h / rms) = (W_g * gamma) h / rms). From two tokens
//                      with bf16 weights the tile runs on tensor cores (moe_router_mma.cuh).
//   router_topk_warp : one warp routes one token: scores, selection bias, group stage, k rounds
//                      of a 64-bit shuffle maximum on (value desc, index asc) keys, renormalise,
//                      scale. P = experts per lane is a template parameter, so every per-lane
//                      array stays in registers and no loop runs over absent entries.
//   router_fused_body: both in one pass; the last block to finish its GEMV tiles (an integer
//                      arrival counter it resets) routes every token.
#pragma once

#include <cfloat>
#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>

#include <encore/ops/moe.h>

#include "common/body.cuh"
#include "common/block.h"
#include "common/counters.cuh"
#include "common/warp.cuh"
#include "moe/moe_router_mma.cuh"

namespace encore::moe {

// How the top-k runs (topk_form): a warp per token with `per` experts per lane, for every config;
// or a block per token with `per` experts per thread where the scores are sigmoids and no group
// stage runs (Kimi's routing): eight warps select at once, a chain a fraction of one warp's, with
// the same bits (router_topk_block).
struct TopkForm {
  bool by_block = false;
  int per = 1;  // experts per lane (a warp per token) or per thread (a block per token)
};
// The block form needs elementwise scores (a softmax's warp-wide sums would change order), no
// group stage, and at most two experts per thread.
__host__ __device__ inline bool topk_fits_block(const ops::MoeRoutingConfig& c) {
  return c.score == ops::MoeScoreFunc::kSigmoid && !(c.n_group > 1 && c.topk_group < c.n_group) &&
         c.num_experts <= 2 * kBlockThreads;
}
// Experts per lane of the warp form for E experts: the smallest power of two >= E / 32 (1..16).
__host__ __device__ inline int topk_lane_width(int num_experts) {
  int P = 1;
  while (P * 32 < num_experts) P *= 2;
  return P;
}
__host__ __device__ inline TopkForm topk_form(const ops::MoeRoutingConfig& c) {
  if (topk_fits_block(c)) return {true, c.num_experts > kBlockThreads ? 2 : 1};
  return {false, topk_lane_width(c.num_experts)};
}
// Tiles: a token each (block form), or 8 tokens, a warp each.
__host__ __device__ inline int router_topk_tiles(int batch, TopkForm form) {
  return form.by_block ? batch : (batch + kWarpsPerBlock - 1) / kWarpsPerBlock;
}
// The warp form's group stage: num_experts floats per warp.
__host__ __device__ constexpr std::size_t topk_warp_smem_bytes(int num_experts) {
  return std::size_t(kWarpsPerBlock) * num_experts * sizeof(float);
}
// The block form's: each warp's k best (key, weight), then the k winners (id, weight).
__host__ __device__ constexpr std::size_t topk_block_smem_bytes(int top_k) {
  return std::size_t(kWarpsPerBlock) * top_k * (8 + 4) + std::size_t(top_k) * (4 + 4);
}
__host__ __device__ inline std::size_t router_topk_smem_bytes(const ops::MoeRoutingConfig& c) {
  return topk_form(c).by_block ? topk_block_smem_bytes(c.top_k) : topk_warp_smem_bytes(c.num_experts);
}
// The fused body's last block routes every token of the batch: one token in the block form where
// it fits, else a warp per token (the block form would route several tokens one after another).
__host__ __device__ inline TopkForm fused_topk_form(const ops::MoeRoutingConfig& c, int batch) {
  const TopkForm form = topk_form(c);
  return form.by_block && batch == 1 ? form : TopkForm{false, topk_lane_width(c.num_experts)};
}
// The fused body's: its GEMV's, then (reused) a flag and the top-k's (the warp form's is the larger).
inline constexpr std::size_t kRouterFusedFlagBytes = 16;
__host__ __device__ inline std::size_t router_fused_smem_bytes(const ops::MoeRoutingConfig& c, const RouterGemvParams& g) {
  const std::size_t warp = topk_warp_smem_bytes(c.num_experts), block = topk_block_smem_bytes(c.top_k);
  const std::size_t routing = kRouterFusedFlagBytes + (warp > block ? warp : block), gemv = router_gemv_smem_bytes(g);
  return routing > gemv ? routing : gemv;
}

// 8 consecutive router weights at `at` (a multiple of 8) as floats.
__device__ __forceinline__ void load_router_weights(const RouterGemvParams& p, std::int64_t at, float (&w)[8]) {
  if (p.weight_bf16) {
    const uint4 raw = __ldg(reinterpret_cast<const uint4*>(static_cast<const __nv_bfloat16*>(p.weight) + at));
    const std::uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      w[2 * i] = __uint_as_float(words[i] << 16);
      w[2 * i + 1] = __uint_as_float(words[i] & 0xFFFF0000u);
    }
  } else {
    device::ldg_float8(static_cast<const float*>(p.weight) + at, w);
  }
}

// Sums v[tt] over the warp; lane tt < min(kTok, left) stores token t0 + tt's sum at out[(t0 + tt) * stride].
template <int kTok>
__device__ __forceinline__ void warp_sum_to_lanes(float (&v)[kTok], float* out, int stride, int left, int t0) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1)
#pragma unroll
    for (int tt = 0; tt < kTok; ++tt) v[tt] += __shfl_xor_sync(0xFFFFFFFFu, v[tt], offset);
  if (lane < kTok && lane < left) {
    float mine = v[0];
#pragma unroll
    for (int tt = 1; tt < kTok; ++tt) mine = lane == tt ? v[tt] : mine;
    out[std::int64_t(t0 + lane) * stride] = mine;
  }
}

// Tokens whose activation loads one round issues together. A token's sum runs in the same order
// whatever the round, so fewer (under a register cap: the megakernel at two blocks per SM) change
// no bit.
inline constexpr int kRouterTokensPerRound = 4;

// The lane's 8 weights of each of the tile's K blocks (times gamma with a fused RMSNorm). Weights
// and gamma are settled before the step, so the bodies load their first tile's before the wait:
// only the activations' round trip is left after it. Nothing for a warp past E.
using RouterTileWeights = float[kRouterSliceBlocks][8];
__device__ inline void load_router_tile(const RouterGemvParams& p, int tile, RouterTileWeights& w) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int expert = (tile / p.slices) * kRouterRowsPerTile + warp;
  if (expert >= p.num_experts) return;
  const int kb0 = (tile % p.slices) * kRouterSliceBlocks;
  const int nb = min(kRouterSliceBlocks, p.hidden_blocks - kb0);
  const std::int64_t hidden = std::int64_t(p.hidden_blocks) * 256;
#pragma unroll
  for (int b = 0; b < kRouterSliceBlocks; ++b)
    if (b < nb) load_router_weights(p, expert * hidden + (kb0 + b) * 256 + lane * 8, w[b]);
  if (p.gamma) {
#pragma unroll
    for (int b = 0; b < kRouterSliceBlocks; ++b)
      if (b < nb) {
        float gv[8];
        device::ldg_float8(p.gamma + (kb0 + b) * 256 + lane * 8, gv);
#pragma unroll
        for (int i = 0; i < 8; ++i) w[b][i] *= gv[i];
      }
  }
}

// One tile with its weights `w` (load_router_tile). No block-level synchronisation: warps of rows
// beyond E simply return.
template <int kTok = kRouterTokensPerRound>
__device__ inline void router_gemv_tile(const RouterGemvParams& p, int tile, const RouterTileWeights& w) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int expert = (tile / p.slices) * kRouterRowsPerTile + warp;
  const int slice = tile % p.slices;
  if (expert >= p.num_experts) return;
  const int kb0 = slice * kRouterSliceBlocks;
  const int nb = min(kRouterSliceBlocks, p.hidden_blocks - kb0);
  const std::int64_t hidden = std::int64_t(p.hidden_blocks) * 256;
  const bool sums = p.gamma && expert == 0;  // one warp per slice leaves the slice's sum of h^2

  // kTok tokens per round: all their activation loads are issued before the first FMA. h may have
  // been written earlier in the same launch (the megakernel): coherent loads. A token's sum runs in
  // the same order whatever the batch.
  for (int t0 = 0; t0 < p.batch; t0 += kTok) {
    float4 x[kTok][kRouterSliceBlocks][2];
#pragma unroll
    for (int tt = 0; tt < kTok; ++tt)
#pragma unroll
      for (int b = 0; b < kRouterSliceBlocks; ++b)
        if (t0 + tt < p.batch && b < nb) {
          const float4* src = reinterpret_cast<const float4*>(p.h + (t0 + tt) * hidden + (kb0 + b) * 256 + lane * 8);
          x[tt][b][0] = src[0];
          x[tt][b][1] = src[1];
        }
    float acc[kTok], sq[kTok];
#pragma unroll
    for (int tt = 0; tt < kTok; ++tt) {
      acc[tt] = 0.f, sq[tt] = 0.f;
#pragma unroll
      for (int b = 0; b < kRouterSliceBlocks; ++b) {
        if (b >= nb || t0 + tt >= p.batch) break;
        const float v[8] = {x[tt][b][0].x, x[tt][b][0].y, x[tt][b][0].z, x[tt][b][0].w,
                            x[tt][b][1].x, x[tt][b][1].y, x[tt][b][1].z, x[tt][b][1].w};
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[tt] = fmaf(w[b][i], v[i], acc[tt]);
        if (sums)
#pragma unroll
          for (int i = 0; i < 8; ++i) sq[tt] = fmaf(v[i], v[i], sq[tt]);
      }
    }
    warp_sum_to_lanes(acc, p.partial + std::int64_t(slice) * p.batch * p.num_experts + expert, p.num_experts, p.batch - t0, t0);
    if (sums) warp_sum_to_lanes(sq, p.sum_squares + std::int64_t(slice) * p.batch, 1, p.batch - t0, t0);
  }
}

// Top-k keys: (value desc, index asc) as one unsigned 64-bit maximum. The float's bits are mapped
// to an unsigned order (negatives flipped), the index stored inverted; 0 marks "taken" (below
// every real key, -inf included).
__device__ __forceinline__ unsigned long long topk_key(float v, int index) {
  const std::uint32_t bits = v == 0.f ? 0u : __float_as_uint(v);  // -0 ties with +0
  const std::uint32_t ordered = (bits & 0x80000000u) ? ~bits : bits | 0x80000000u;
  return (static_cast<unsigned long long>(ordered) << 32) | std::uint32_t(0xFFFFFFFFu - std::uint32_t(index));
}
__device__ __forceinline__ int key_index(unsigned long long key) { return int(0xFFFFFFFFu - std::uint32_t(key)); }

// The warp's largest key, as two single-instruction reductions (redux.sync): the largest high
// word, then the largest low word among the lanes that hold it. The same key as a 64-bit maximum,
// so the same routing, in a fraction of the five dependent 64-bit shuffle steps.
__device__ __forceinline__ unsigned long long warp_max(unsigned long long key) {
  const std::uint32_t hi = std::uint32_t(key >> 32), lo = std::uint32_t(key);
  const std::uint32_t best_hi = __reduce_max_sync(0xFFFFFFFFu, hi);
  const std::uint32_t best_lo = __reduce_max_sync(0xFFFFFFFFu, hi == best_hi ? lo : 0u);
  return (static_cast<unsigned long long>(best_hi) << 32) | best_lo;
}

// ---- the top-k's pieces, shared by its two forms ----------------------------------------------
// A thread holds N consecutive experts first .. first + N - 1 (those below E are present).

// The router's logits of the thread's experts for `token`: the slices' partials added in slice
// order (loaded together with the caller's slot id: one round trip at the common slice counts),
// scaled by 1 / rms when the RMSNorm is fused. The partials come from the GEMV tiles, of this launch in the fused body and the
// megakernel: loads through L2 (ld.cg), never a stale L1 line; bias and slot ids are settled inputs.
template <int N>
__device__ __forceinline__ void load_scores(const RouterTopkParams& p, int token, int first, float (&score)[N], float (&bias)[N],
                                            bool (&present)[N]) {
  const int E = p.config.num_experts;
#pragma unroll
  for (int i = 0; i < N; ++i) present[i] = first + i < E;
#pragma unroll
  for (int i = 0; i < N; ++i) bias[i] = p.bias && present[i] ? __ldg(p.bias + first + i) : 0.f;
#pragma unroll
  for (int i = 0; i < N; ++i) score[i] = 0.f;
  float sum_sq = 0.f;
  constexpr int kSlicesInFlight = N <= 4 ? 4 : N <= 8 ? 3 : 2;
  for (int s0 = 0; s0 < p.slices; s0 += kSlicesInFlight) {
    float part[kSlicesInFlight][N], sq[kSlicesInFlight];
#pragma unroll
    for (int j = 0; j < kSlicesInFlight; ++j) {
      const float* row = p.logits + (std::int64_t(s0 + j) * p.batch + token) * E + first;
#pragma unroll
      for (int i = 0; i < N; ++i) part[j][i] = s0 + j < p.slices && present[i] ? __ldcg(row + i) : 0.f;
      sq[j] = p.sum_squares && s0 + j < p.slices ? __ldcg(p.sum_squares + std::int64_t(s0 + j) * p.batch + token) : 0.f;
    }
#pragma unroll
    for (int j = 0; j < kSlicesInFlight; ++j) {
      sum_sq += sq[j];
#pragma unroll
      for (int i = 0; i < N; ++i)
        if (s0 + j < p.slices && present[i]) score[i] += part[j][i];
    }
  }
  if (p.sum_squares) {
    const float inv_rms = rsqrtf(sum_sq / float(p.hidden) + p.eps);
#pragma unroll
    for (int i = 0; i < N; ++i) score[i] *= inv_rms;
  }
}

// A pad row routes nowhere: ids -1, weights 0 (slot j written by the caller's thread j < k).
__device__ __forceinline__ void store_pad_slot(const RouterTopkParams& p, int token, int j) {
  if (j < p.config.top_k) {
    p.ids[std::int64_t(token) * p.config.top_k + j] = -1;
    p.weights[std::int64_t(token) * p.config.top_k + j] = 0.f;
  }
}

// The selection value (score + bias; NaN never wins) and the weight each expert would carry.
template <int N>
__device__ __forceinline__ void selection_of(const ops::MoeRoutingConfig& c, bool with_bias, const float (&score)[N],
                                             const float (&bias)[N], float (&choice)[N], float (&weight_of)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
    float v = with_bias ? score[i] + bias[i] : score[i];
    if (isnan(v)) v = -FLT_MAX;
    choice[i] = v;
    weight_of[i] = c.hf_remote_biased_weights ? v : score[i];
  }
}

// Sorts the thread's N (key, weight) pairs descending: odd-even transposition, every index
// compile-time, so everything stays in registers.
template <int N>
__device__ __forceinline__ void sort_descending(unsigned long long (&key)[N], float (&weight_of)[N]) {
#pragma unroll
  for (int pass = 0; pass < N; ++pass)
#pragma unroll
    for (int i = pass & 1; i + 1 < N; i += 2)
      if (key[i + 1] > key[i]) {
        const unsigned long long k = key[i];
        key[i] = key[i + 1], key[i + 1] = k;
        const float w = weight_of[i];
        weight_of[i] = weight_of[i + 1], weight_of[i + 1] = w;
      }
}

// Pops the head of a thread's sorted keys (the caller's head just won a round).
template <int N>
__device__ __forceinline__ void pop_head(unsigned long long (&key)[N], float (&weight_of)[N]) {
#pragma unroll
  for (int i = 0; i + 1 < N; ++i) key[i] = key[i + 1], weight_of[i] = weight_of[i + 1];
  key[N - 1] = 0ull;
}

// Slot j of the token: the j-th expert chosen and its weight, renormalised by `sum` (the chosen
// weights added in selection order) and scaled.
__device__ __forceinline__ void store_slot(const RouterTopkParams& p, int token, int j, int id, float weight, float sum) {
  const ops::MoeRoutingConfig& c = p.config;
  if (c.renormalize && (c.top_k > 1 || c.renormalize_top1)) weight = weight / (sum + c.renorm_eps);
  weight *= c.routed_scale;
  if (c.weights_to_bf16) weight = __bfloat162float(__float2bfloat16(weight));
  p.ids[std::int64_t(token) * c.top_k + j] = id;
  p.weights[std::int64_t(token) * c.top_k + j] = weight;
}

// ---- a warp per token ---------------------------------------------------------------------------

// Routes token `token` with the calling warp; P = experts per lane (lane l holds l*P .. l*P+P-1).
// `choice_smem`: num_experts floats for this warp (group stage only).
template <int P>
__device__ void router_topk_warp(const RouterTopkParams& p, int token, float* choice_smem) {
  const ops::MoeRoutingConfig& c = p.config;
  const int lane = threadIdx.x % 32;
  const int E = c.num_experts;
  const bool pad = device::is_pad_row(p.slot_ids, token);
  bool present[P];
  float score[P], bias[P];
  load_scores<P>(p, token, lane * P, score, bias, present);
  if (pad) return store_pad_slot(p, token, lane);  // no routing, no work downstream
  float local_max = -INFINITY;
#pragma unroll
  for (int i = 0; i < P; ++i)
    if (present[i]) {
      local_max = fmaxf(local_max, score[i]);
      if (p.logits_out) p.logits_out[std::int64_t(token) * E + lane * P + i] = score[i];
    }
  if (c.score == ops::MoeScoreFunc::kSigmoid) {
#pragma unroll
    for (int i = 0; i < P; ++i) score[i] = 1.f / (1.f + expf(-score[i]));
  } else {
    const float mx = device::warp_max(local_max);
    float sum = 0.f;
#pragma unroll
    for (int i = 0; i < P; ++i) {
      score[i] = present[i] ? expf(score[i] - mx) : 0.f;
      sum += score[i];
    }
    sum = device::warp_sum(sum);
#pragma unroll
    for (int i = 0; i < P; ++i) score[i] = score[i] / sum;
  }
  float choice[P], weight_of[P];
  selection_of<P>(c, p.bias != nullptr, score, bias, choice, weight_of);

  // Group stage: lane g scores group g (sum of its top-2 choices with a bias, else its max) and
  // keeps it when fewer than topk_group groups beat it (score desc, index asc).
  if (c.n_group > 1 && c.topk_group < c.n_group) {
    const bool biased_weights = c.hf_remote_biased_weights;
    const int per = E / c.n_group;
#pragma unroll
    for (int i = 0; i < P; ++i)
      if (present[i]) choice_smem[lane * P + i] = choice[i];
    __syncwarp();
    float group_score = -INFINITY;
    if (lane < c.n_group) {
      float best = -INFINITY, second = -INFINITY;
      for (int e = lane * per; e < (lane + 1) * per; ++e) {
        const float v = choice_smem[e];
        if (v > best) {
          second = best;
          best = v;
        } else if (v > second) {
          second = v;
        }
      }
      group_score = (p.bias || biased_weights) && per > 1 ? best + second : best;
    }
    int rank = 0;
    for (int g = 0; g < c.n_group; ++g) {
      const float other = __shfl_sync(0xFFFFFFFFu, group_score, g);
      rank += (other > group_score || (other == group_score && g < lane)) ? 1 : 0;
    }
    const bool kept = lane < c.n_group && rank < c.topk_group;
    const float masked = biased_weights || c.mask_fill_zero ? 0.f : -INFINITY;
#pragma unroll
    for (int i = 0; i < P; ++i) {
      const int group = min((lane * P + i) / per, c.n_group - 1);
      if (!__shfl_sync(0xFFFFFFFFu, kept, group)) choice[i] = masked;
    }
    __syncwarp();
  }

  // Each lane sorts its P keys once; then k rounds of a 64-bit warp maximum over the lanes' heads,
  // the winning lane popping its head. Lane j keeps slot j.
  unsigned long long key[P];
#pragma unroll
  for (int i = 0; i < P; ++i) key[i] = present[i] ? topk_key(choice[i], lane * P + i) : 0ull;
  sort_descending<P>(key, weight_of);
  int my_id = 0;
  float my_weight = 0.f, sum = 0.f;
  for (int j = 0; j < c.top_k; ++j) {
    const unsigned long long winner = warp_max(key[0]);
    const int id = key_index(winner);
    const float w = __shfl_sync(0xFFFFFFFFu, weight_of[0], id / P);
    if (key[0] == winner) pop_head<P>(key, weight_of);
    if (lane == j) my_id = id, my_weight = w;
    sum += w;
  }
  if (lane < c.top_k) store_slot(p, token, lane, my_id, my_weight, sum);
}

// ---- a block per token --------------------------------------------------------------------------

// The block form's shared memory (topk_block_smem_bytes).
struct TopkBlockSmem {
  unsigned long long* key;  // [warps][k] each warp's k best keys, in its selection order
  float* weight;            // [warps][k] their weights
  int* win_id;              // [k] the token's experts, in selection order
  float* win_weight;        // [k]
  __device__ TopkBlockSmem(char* smem, int k) {
    key = reinterpret_cast<unsigned long long*>(smem);
    weight = reinterpret_cast<float*>(key + kWarpsPerBlock * k);
    win_id = reinterpret_cast<int*>(weight + kWarpsPerBlock * k);
    win_weight = reinterpret_cast<float*>(win_id + k);
  }
};

// Routes token `token` with the whole block (topk_fits_block): thread t holds experts
// t*Q .. t*Q+Q-1. Every warp picks its k best by k rounds of a warp maximum, as the warp form
// does over all experts; each of the 8k candidates then finds its place by counting the larger
// ones (keys are distinct; an absent expert's key 0 never places among the first k, since k <= E).
// The values, the selection order and the sum of the chosen weights (in selection order) are
// the warp form's, so the bits are too. Ends with a block barrier (the shared memory is free).
template <int Q>
__device__ void router_topk_block(const RouterTopkParams& p, int token, char* smem) {
  const ops::MoeRoutingConfig& c = p.config;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, first = int(threadIdx.x) * Q, k = c.top_k;
  const bool pad = device::is_pad_row(p.slot_ids, token);
  bool present[Q];
  float score[Q], bias[Q];
  load_scores<Q>(p, token, first, score, bias, present);
  if (pad) return store_pad_slot(p, token, int(threadIdx.x));  // (block-uniform)
#pragma unroll
  for (int i = 0; i < Q; ++i) {
    if (present[i] && p.logits_out) p.logits_out[std::int64_t(token) * c.num_experts + first + i] = score[i];
    score[i] = 1.f / (1.f + expf(-score[i]));
  }
  float choice[Q], weight_of[Q];
  selection_of<Q>(c, p.bias != nullptr, score, bias, choice, weight_of);
  unsigned long long key[Q];
#pragma unroll
  for (int i = 0; i < Q; ++i) key[i] = present[i] ? topk_key(choice[i], first + i) : 0ull;
  sort_descending<Q>(key, weight_of);

  const TopkBlockSmem s(smem, k);
  for (int j = 0; j < k; ++j) {
    const unsigned long long winner = warp_max(key[0]);
    const float w = __shfl_sync(0xFFFFFFFFu, weight_of[0], (key_index(winner) / Q) & 31);
    if (key[0] == winner) pop_head<Q>(key, weight_of);
    if (lane == 0) s.key[warp * k + j] = winner, s.weight[warp * k + j] = w;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < kWarpsPerBlock * k; i += kBlockThreads) {
    const unsigned long long mine = s.key[i];
    int place = 0;
#pragma unroll 8
    for (int o = 0; o < kWarpsPerBlock * k; ++o) place += s.key[o] > mine;
    if (place < k) s.win_id[place] = key_index(mine), s.win_weight[place] = s.weight[i];
  }
  __syncthreads();
  if (warp == 0) {
    float sum = 0.f;
    for (int j = 0; j < k; ++j) sum += s.win_weight[j];
    if (lane < k) store_slot(p, token, lane, s.win_id[lane], s.win_weight[lane], sum);
  }
  __syncthreads();
}
// ---- bodies (common/body.cuh) --------------------------------------------------------------------
// The range's GEMV tiles in the form router_gemv_uses_mma picks (kTok = 1 only runs one token);
// `smem`: router_gemv_smem_bytes. Each tile's weights are loaded before the wait (only the first
// tile's loads wait for nothing; later calls return at once).
template <int kTok = kRouterTokensPerRound, class Range, class Wait>
__device__ void router_gemv_tiles_of(const RouterGemvParams& p, const Range& r, char* smem, Wait& wait) {
  const int tiles = router_gemv_tiles(p);
  if constexpr (kTok > 1) {
    if (router_gemv_uses_mma(p)) {
      for (int tile = r.first(); tile < tiles; tile += r.stride()) {
        RouterMmaWeights w;
        load_router_tile_mma(p, tile, w);
        wait();
        router_gemv_tile_mma(p, tile, w, smem);
      }
      return;
    }
  }
  for (int tile = r.first(); tile < tiles; tile += r.stride()) {
    RouterTileWeights w;
    load_router_tile(p, tile, w);
    wait();
    router_gemv_tile<kTok>(p, tile, w);
  }
}

template <int kTok = kRouterTokensPerRound, class Range, class Wait>
__device__ void router_gemv_body(const RouterGemvParams& p, const Range& r, char* smem, Wait& wait) {
  router_gemv_tiles_of<kTok>(p, r, smem, wait);
  wait();  // (a block without a tile)
}

// The top-k of the range's tiles in the form Form (TopkFormOf); `smem`: router_topk_smem_bytes.
template <class Form, class Range, class Wait>
__device__ void router_topk_body(const RouterTopkParams& p, const Range& r, char* smem, Wait& wait) {
  wait();
  const int tiles = router_topk_tiles(p.batch, TopkForm{Form::kByBlock, Form::kPer});
  const int warp = threadIdx.x / 32;
  for (int tile = r.first(); tile < tiles; tile += r.stride()) {
    if constexpr (Form::kByBlock) {
      router_topk_block<Form::kPer>(p, tile, smem);
    } else {
      const int token = tile * kWarpsPerBlock + warp;
      if (token < p.batch) router_topk_warp<Form::kPer>(p, token, reinterpret_cast<float*>(smem) + warp * p.config.num_experts);
    }
  }
}

// Logits and routing in one pass (ops::MoeRouterParams::counter): the GEMV tiles of the range,
// then the block whose arrival completes the count routes every token (fused_topk_form) and
// resets the counter. `smem`: router_fused_smem_bytes. Release: each block's sums are written
// (barrier, fence) before it counts; acquire: the last block fences after counting, and the
// top-k reads the sums through L2.
template <class Form, int kTok = kRouterTokensPerRound, class Range, class Wait>
__device__ void router_fused_body(const RouterGemvParams& g, const RouterTopkParams& t, int* counter, const Range& r, char* smem,
                                  Wait& wait) {
  const int tiles = router_gemv_tiles(g);
  const int mine = r.first() < tiles ? (tiles - 1 - r.first()) / r.stride() + 1 : 0;
  router_gemv_tiles_of<kTok>(g, r, smem, wait);
  wait();  // (a block without a tile)
  int* last = reinterpret_cast<int*>(smem);
  __syncthreads();  // every warp's sums are written
  if (threadIdx.x == 0) {
    bool is_last = false;
    if (mine > 0) {
      is_last = device::add_acq_rel_gpu(counter, mine) + mine == tiles;
      if (is_last) *counter = 0;  // the next call starts from zero (no other block touches it after its arrival)
    }
    *last = is_last;
  }
  __syncthreads();
  if (!*last) return;
  static_assert(ops::kMoeRouterOnePassMaxBatch <= kWarpsPerBlock, "the one-pass form gives every token a warp of its own");
  if constexpr (Form::kByBlock) {  // (one token: fused_topk_form)
    router_topk_block<Form::kPer>(t, 0, smem + kRouterFusedFlagBytes);
  } else {
    const int warp = threadIdx.x / 32;
    float* choice = reinterpret_cast<float*>(smem + kRouterFusedFlagBytes) + warp * t.config.num_experts;
    for (int token = warp; token < t.batch; token += kWarpsPerBlock) router_topk_warp<Form::kPer>(t, token, choice);
  }
}

// Calls f(std::integral_constant<int, P>{}) for a lane width P of 1, 2, 4, 8 or 16 (larger: 16),
// the warp form's template parameter.
template <class F>
__host__ __device__ decltype(auto) with_lane_width(int lane_width, F&& f) {
  switch (lane_width) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 4: return f(std::integral_constant<int, 4>{});
    case 8: return f(std::integral_constant<int, 8>{});
    default: return f(std::integral_constant<int, 16>{});
  }
}

// A top-k form as types: router_topk_body's template parameter.
template <bool kBlock, int kExperts>
struct TopkFormOf {
  static constexpr bool kByBlock = kBlock;
  static constexpr int kPer = kExperts;
};
// Calls f(TopkFormOf<...>{}) for `form`: one switch for every launcher and the megakernel.
template <class F>
__host__ __device__ decltype(auto) with_topk_form(TopkForm form, F&& f) {
  if (form.by_block) return form.per == 1 ? f(TopkFormOf<true, 1>{}) : f(TopkFormOf<true, 2>{});
  return with_lane_width(form.per, [&](auto p) { return f(TopkFormOf<false, decltype(p)::value>{}); });
}

}  // namespace encore::moe
