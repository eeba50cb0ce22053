// The MoE ops' device-ready plans, for callers that run the bodies themselves (the megakernel):
// the router's two stages, and the expert streams planned for a given grid (the general plan: the
// work list comes from its own stage, not from the stream blocks). How the entries are grouped
// into passes changes no bits: a token's sums never depend on the other tokens.
#pragma once

#include <cstddef>

#include <encore/ops/moe.h>
#include <encore/status.h>

#include "moe/moe_expert_stream.cuh"
#include "moe/moe_router_tile.cuh"

namespace encore::moe {

struct RouterPlan {
  RouterGemvParams gemv;
  RouterTopkParams topk;
  TopkForm topk_form;        // the top-k body's form (its template parameter, with_topk_form)
  std::size_t topk_smem = 0;
  int* counter = nullptr;   // set: one fused pass (router_fused_body) in fused_form, with fused_smem bytes
  TopkForm fused_form;
  std::size_t fused_smem = 0;
};
Status plan_router(const ops::MoeRouterParams& p, RouterPlan* out);

struct ExpertsPlan {
  ExpertsTileParams params;
  StreamShape gate_up, down;
  std::size_t gate_up_smem = 0, down_smem = 0;
};
// Streams of `blocks` blocks with `smem_per_block` bytes each, sized for p.batch tokens. in_block
// (p.batch <= kTokensPerPass): every stream block builds the work list itself, passes as wide as
// the batch, and the gate/up blocks quantise the whole batch's input once (the small-batch plan).
// Down runs whole row chunks at every batch (down_chunks_body): at one token its row sets measured
// slower in the megakernel (docs/moe.md §6).
Status plan_experts_for_grid(const ops::MoeExpertsParams& p, int blocks, std::size_t smem_per_block, bool in_block, ExpertsPlan* out);
// The streams' tensor maps (host, through the driver).
Status encode_experts_maps(const ops::MoeExpertsParams& p, const ExpertsPlan& plan, StreamMaps* gate_up, StreamMaps* down);

}  // namespace encore::moe
