// Device bodies of MoE routing (specs/moe.md §2):
//   router_gemv_tile : logits = W_g h for 8 experts (one per warp) over one K slice, all tokens;
//                      partial sums per slice, added in slice order by the top-k (deterministic).
//   router_topk_warp : one warp routes one token: scores, selection bias, group stage, k rounds
//                      of shuffle argmax on (value desc, index asc), renormalise, scale.
#pragma once

#include <cfloat>
#include <cstdint>

#include <cuda_bf16.h>

#include <encore/ops/moe.h>

#include "common/launch.cuh"

namespace encore::moe {

inline constexpr int kRouterSliceBlocks = 3;  // 256-value blocks of K per router tile (768 values)
inline constexpr int kRouterRowsPerTile = kWarpsPerBlock;
inline constexpr int kMaxScoresPerLane = ops::kMaxMoeExperts / 32;

struct RouterGemvParams {
  const void* weight;       // [E][hidden] fp32 or bf16
  bool weight_bf16;
  const float* h;           // [batch][hidden]
  int hidden_blocks;        // hidden / 256
  int slices;               // ceil(hidden_blocks / kRouterSliceBlocks)
  int batch;
  int num_experts;
  float* partial;           // [slices][batch][E]
};

struct RouterTopkParams {
  ops::MoeRoutingConfig config;
  const float* logits;      // [slices][batch][E], summed over slices in order
  int slices;
  const float* bias;        // optional [E]
  int batch;
  int* ids;                 // [batch][k]
  float* weights;           // [batch][k]
  float* logits_out;        // optional [batch][E]
};

__host__ __device__ inline int router_gemv_tiles(const RouterGemvParams& p) {
  return (p.num_experts + kRouterRowsPerTile - 1) / kRouterRowsPerTile * p.slices;
}
__host__ __device__ inline int router_topk_tiles(int batch) { return (batch + kWarpsPerBlock - 1) / kWarpsPerBlock; }
__host__ __device__ constexpr std::size_t router_topk_smem_bytes(int num_experts) {
  return std::size_t(kWarpsPerBlock) * num_experts * sizeof(float);
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
    const float4* src = reinterpret_cast<const float4*>(static_cast<const float*>(p.weight) + at);
    const float4 a = __ldg(src), b = __ldg(src + 1);
    const float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
    for (int i = 0; i < 8; ++i) w[i] = v[i];
  }
}

// No block-level synchronisation: warps of rows beyond E simply return.
__device__ inline void router_gemv_tile(const RouterGemvParams& p, int tile) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int expert = (tile / p.slices) * kRouterRowsPerTile + warp;
  const int slice = tile % p.slices;
  if (expert >= p.num_experts) return;
  const int kb0 = slice * kRouterSliceBlocks;
  const int nb = min(kRouterSliceBlocks, p.hidden_blocks - kb0);
  const std::int64_t hidden = std::int64_t(p.hidden_blocks) * 256;

  float w[kRouterSliceBlocks][8];
#pragma unroll
  for (int b = 0; b < kRouterSliceBlocks; ++b)
    if (b < nb) load_router_weights(p, expert * hidden + (kb0 + b) * 256 + lane * 8, w[b]);

  // kTok tokens per round: all their activation loads are issued before the first FMA (h is
  // read-only here, so the non-coherent path may batch them). A token's sum runs in the same order
  // whatever the batch.
  constexpr int kTok = 4;
  for (int t0 = 0; t0 < p.batch; t0 += kTok) {
    float4 x[kTok][kRouterSliceBlocks][2];
#pragma unroll
    for (int tt = 0; tt < kTok; ++tt)
#pragma unroll
      for (int b = 0; b < kRouterSliceBlocks; ++b)
        if (t0 + tt < p.batch && b < nb) {
          const float4* src = reinterpret_cast<const float4*>(p.h + (t0 + tt) * hidden + (kb0 + b) * 256 + lane * 8);
          x[tt][b][0] = __ldg(src);
          x[tt][b][1] = __ldg(src + 1);
        }
    float acc[kTok];
#pragma unroll
    for (int tt = 0; tt < kTok; ++tt) {
      acc[tt] = 0.f;
#pragma unroll
      for (int b = 0; b < kRouterSliceBlocks; ++b) {
        if (b >= nb || t0 + tt >= p.batch) break;
        const float v[8] = {x[tt][b][0].x, x[tt][b][0].y, x[tt][b][0].z, x[tt][b][0].w,
                            x[tt][b][1].x, x[tt][b][1].y, x[tt][b][1].z, x[tt][b][1].w};
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[tt] = fmaf(w[b][i], v[i], acc[tt]);
      }
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1)
#pragma unroll
      for (int tt = 0; tt < kTok; ++tt) acc[tt] += __shfl_xor_sync(0xFFFFFFFFu, acc[tt], offset);
    if (lane < kTok && t0 + lane < p.batch) {
      float mine = acc[0];
#pragma unroll
      for (int tt = 1; tt < kTok; ++tt) mine = lane == tt ? acc[tt] : mine;
      p.partial[(std::int64_t(slice) * p.batch + t0 + lane) * p.num_experts + expert] = mine;
    }
  }
}

// (value desc, index asc): a total order, so the xor-butterfly argmax gives every lane the same winner.
struct Candidate {
  float value;
  int index;
  float weight;  // the routing weight the candidate would get
};
__device__ __forceinline__ bool better(float v, int i, const Candidate& c) {
  return v > c.value || (v == c.value && i < c.index);
}
__device__ __forceinline__ Candidate warp_best(Candidate c) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float v = __shfl_xor_sync(0xFFFFFFFFu, c.value, offset);
    const int i = __shfl_xor_sync(0xFFFFFFFFu, c.index, offset);
    const float w = __shfl_xor_sync(0xFFFFFFFFu, c.weight, offset);
    if (better(v, i, c)) c = {v, i, w};
  }
  return c;
}

// Routes token `token` with the calling warp. `choice_smem`: num_experts floats for this warp.
// Lane l holds experts l*P .. l*P+P-1, P = ceil(E/32).
__device__ inline void router_topk_warp(const RouterTopkParams& p, int token, float* choice_smem) {
  const ops::MoeRoutingConfig& c = p.config;
  const int lane = threadIdx.x % 32;
  const int E = c.num_experts, P = (E + 31) / 32;
  const bool sigmoid = c.score == ops::MoeScoreFunc::kSigmoid;

  float score[kMaxScoresPerLane], choice[kMaxScoresPerLane];
  std::uint32_t taken = 0;  // bit i: expert lane*P+i selected or absent
#pragma unroll
  for (int i = 0; i < kMaxScoresPerLane; ++i) {
    score[i] = 0.f;
    if (!(i < P && lane * P + i < E)) taken |= 1u << i;
  }
  // Logits = sum of the slices' partials in slice order; all loads of a slice issued at once.
  for (int s = 0; s < p.slices; ++s) {
    const float* row = p.logits + (std::int64_t(s) * p.batch + token) * E + lane * P;
#pragma unroll
    for (int i = 0; i < kMaxScoresPerLane; ++i)
      if (!(taken >> i & 1)) score[i] += __ldg(row + i);
  }
  float local_max = -INFINITY;
#pragma unroll
  for (int i = 0; i < kMaxScoresPerLane; ++i)
    if (!(taken >> i & 1)) {
      local_max = fmaxf(local_max, score[i]);
      if (p.logits_out) p.logits_out[std::int64_t(token) * E + lane * P + i] = score[i];
    } else {
      score[i] = -INFINITY;
    }
  if (sigmoid) {
#pragma unroll
    for (int i = 0; i < kMaxScoresPerLane; ++i)
      if (!(taken >> i & 1)) score[i] = 1.f / (1.f + expf(-score[i]));
  } else {
    float mx = local_max;
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, offset));
    float sum = 0.f;
#pragma unroll
    for (int i = 0; i < kMaxScoresPerLane; ++i)
      if (!(taken >> i & 1)) {
        score[i] = expf(score[i] - mx);
        sum += score[i];
      }
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, offset);
#pragma unroll
    for (int i = 0; i < kMaxScoresPerLane; ++i)
      if (!(taken >> i & 1)) score[i] = score[i] / sum;
  }
#pragma unroll
  for (int i = 0; i < kMaxScoresPerLane; ++i) {
    const int e = lane * P + i;
    float v = -INFINITY;
    if (!(taken >> i & 1)) {
      v = p.bias ? score[i] + __ldg(p.bias + e) : score[i];
      if (isnan(v)) v = -FLT_MAX;
    }
    choice[i] = v;
  }

  // Group stage: lane g scores group g (sum of its top-2 choices with a bias, else its max),
  // keeps it when fewer than topk_group groups beat it (score desc, index asc).
  const bool biased_weights = c.hf_remote_biased_weights;
  float weight_of[kMaxScoresPerLane];
#pragma unroll
  for (int i = 0; i < kMaxScoresPerLane; ++i) weight_of[i] = biased_weights ? choice[i] : score[i];
  if (c.n_group > 1 && c.topk_group < c.n_group) {
    const int per = E / c.n_group;
#pragma unroll
    for (int i = 0; i < kMaxScoresPerLane; ++i)
      if (!(taken >> i & 1)) choice_smem[lane * P + i] = choice[i];
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
#pragma unroll
    for (int i = 0; i < kMaxScoresPerLane; ++i) {
      const int e = lane * P + i;
      const int group = min(e / per, c.n_group - 1);
      const bool group_kept = __shfl_sync(0xFFFFFFFFu, kept, group) != 0;
      if (!(taken >> i & 1) && !group_kept) choice[i] = biased_weights ? 0.f : -INFINITY;
    }
    __syncwarp();
  }

  // k rounds of argmax; lane j keeps slot j.
  int my_id = 0;
  float my_weight = 0.f, sum = 0.f;
  for (int j = 0; j < c.top_k; ++j) {
    Candidate best{-INFINITY, INT_MAX, 0.f};
#pragma unroll
    for (int i = 0; i < kMaxScoresPerLane; ++i)
      if (!(taken >> i & 1) && better(choice[i], lane * P + i, best)) best = {choice[i], lane * P + i, weight_of[i]};
    best = warp_best(best);
    if (best.index / P == lane) taken |= 1u << (best.index % P);
    if (lane == j) {
      my_id = best.index;
      my_weight = best.weight;
    }
    sum += best.weight;
  }
  if (lane < c.top_k) {
    if (c.renormalize) my_weight = my_weight / (sum + c.renorm_eps);
    my_weight *= c.routed_scale;
    p.ids[std::int64_t(token) * c.top_k + lane] = my_id;
    p.weights[std::int64_t(token) * c.top_k + lane] = my_weight;
  }
}

}  // namespace encore::moe
