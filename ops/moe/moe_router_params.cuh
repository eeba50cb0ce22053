// Parameters of the MoE routing bodies (moe_router_tile.cuh, moe_router_mma.cuh): the router
// GEMV's tiles of (8 experts, one K slice) and the top-k's inputs and outputs.
#pragma once

#include <cstdint>

#include <encore/ops/moe.h>

#include "common/block.h"

namespace encore::moe {

inline constexpr int kRouterSliceBlocks = 3;  // 256-value blocks of K per router tile (768 values)
inline constexpr int kRouterRowsPerTile = kWarpsPerBlock;

struct RouterGemvParams {
  const void* weight;       // [E][hidden] fp32 or bf16
  bool weight_bf16;
  const float* h;           // [batch][hidden]
  const float* gamma;       // optional [hidden]: fused RMSNorm weight
  int hidden_blocks;        // hidden / 256
  int slices;               // ceil(hidden_blocks / kRouterSliceBlocks)
  int batch;
  int num_experts;
  float* partial;           // [slices][batch][E]
  float* sum_squares;       // [slices][batch], written when gamma is set
};

struct RouterTopkParams {
  ops::MoeRoutingConfig config;
  const float* logits;      // [slices][batch][E], summed over slices in order
  int slices;
  const float* sum_squares; // optional [slices][batch]: logits are scaled by rsqrt(sum / hidden + eps)
  int hidden;
  float eps;
  const float* bias;        // optional [E]
  int batch;
  int* ids;                 // [batch][k]
  float* weights;           // [batch][k]
  float* logits_out;        // optional [batch][E]
  const int* slot_ids;      // optional [batch]; < 0: pad row
};

__host__ __device__ inline int router_gemv_tiles(const RouterGemvParams& p) {
  return (p.num_experts + kRouterRowsPerTile - 1) / kRouterRowsPerTile * p.slices;
}

}  // namespace encore::moe
