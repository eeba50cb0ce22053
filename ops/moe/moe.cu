// Standalone kernels and validating launchers of the MoE ops.
#include <encore/ops/moe.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "common/cuda_check.h"
#include "common/block.h"
#include "common/launch.h"
#include "common/tensor_map.h"
#include "moe/moe_expert_stream.cuh"
#include "moe/moe_work_list.cuh"
#include "moe/moe_plan.h"
#include "moe/moe_router_tile.cuh"

namespace encore::ops {
namespace {

using moe::ExpertsTileParams;
using moe::RouterGemvParams;
using moe::RouterTopkParams;

// ---- kernels ------------------------------------------------------------------------------------

// kTok: tokens per round of the GEMV tiles (the launchers take one at one token, so that no code
// runs for absent tokens; a token's sums are the same whatever the round).
template <int kTok>
__global__ void __launch_bounds__(kBlockThreads) router_gemv_kernel(const __grid_constant__ RouterGemvParams p) {
  device::PdlWait wait;
  extern __shared__ __align__(16) char smem[];
  moe::router_gemv_body<kTok>(p, device::GridRange{}, smem, wait);
}

template <class Form>
__global__ void __launch_bounds__(kBlockThreads) router_topk_kernel(const __grid_constant__ RouterTopkParams p) {
  extern __shared__ __align__(16) char smem[];
  device::PdlWait wait;
  moe::router_topk_body<Form>(p, device::GridRange{}, smem, wait);
}

// Logits and routing in one kernel (MoeRouterParams::counter): the last block to finish routes.
template <class Form, int kTok>
__global__ void __launch_bounds__(kBlockThreads) router_fused_kernel(const __grid_constant__ RouterGemvParams g,
                                                                     const __grid_constant__ RouterTopkParams t, int* counter) {
  extern __shared__ __align__(16) char smem[];
  device::PdlWait wait;
  moe::router_fused_body<Form, kTok>(g, t, counter, device::GridRange{}, smem, wait);
}

// Prepare: the work list (tile 0) and the int8 activations of h (tiles 1..).
__global__ void __launch_bounds__(kBlockThreads) moe_prepare_kernel(const __grid_constant__ ExpertsTileParams p, int tiles) {
  extern __shared__ __align__(16) char smem[];
  device::PdlWait wait;
  moe::prepare_body(p, tiles, device::GridRange{}, smem, wait);
}

// Gate/up and down: streaming blocks per SM as planned (their rings fill the shared memory).
// kInBlock: each block builds the work list itself (small batches, no prepare kernel). kPass: the
// most entries a pass holds (one token: 1, so no code runs for absent entries; the same sums).
template <int BlocksPerSm, bool kInBlock, int kPass = moe::kTokensPerPass>
__global__ void __launch_bounds__(kBlockThreads, BlocksPerSm)
    moe_gate_up_kernel(const __grid_constant__ ExpertsTileParams p, const moe::StreamShape shape,
                       const __grid_constant__ moe::StreamMaps maps) {
  extern __shared__ __align__(128) char smem[];
  device::PdlWait wait;
  moe::gate_up_body<kInBlock, moe::ExpertSet::kAll, kPass>(p, shape, maps, device::GridRange{}, smem, wait);  // waits for the routing inside
}

// Waits for the gate/up kernel inside the body, after its weight copies are issued.
template <int BlocksPerSm, bool kInBlock, int kPass = moe::kTokensPerPass>
__global__ void __launch_bounds__(kBlockThreads, BlocksPerSm)
    moe_down_kernel(const __grid_constant__ ExpertsTileParams p, const moe::StreamShape shape,
                    const __grid_constant__ moe::StreamMaps maps) {
  extern __shared__ __align__(128) char smem[];
  device::PdlWait wait;
  moe::down_body<kInBlock, kPass>(p, shape, maps, device::GridRange{}, smem, wait);
}

// ---- helpers ------------------------------------------------------------------------------------

int router_slices(int hidden) { return (hidden / 256 + moe::kRouterSliceBlocks - 1) / moe::kRouterSliceBlocks; }

// Offsets of the expert stage's workspace pieces (16-byte aligned, in this order).
struct ExpertsLayout {
  std::size_t num_passes, passes, entry_token, entry_weight, token_entries, chunk_done, act_in, act_mid, y, total;
};
ExpertsLayout experts_layout(int max_batch, int num_experts, int num_shared, int top_k, int hidden, int inter) {
  const std::size_t entries = std::size_t(max_batch) * (top_k + num_shared);
  ExpertsLayout l{};
  std::size_t at = 0;
  auto take = [&at](std::size_t bytes) {
    const std::size_t here = at;
    at = (at + bytes + 15) / 16 * 16;
    return here;
  };
  l.num_passes = take(sizeof(int));
  l.passes = take(std::size_t(moe::max_passes(max_batch, num_experts, num_shared, top_k, 1)) * sizeof(int4));  // any tokens_per_pass
  l.entry_token = take(entries * sizeof(int));
  l.entry_weight = take(entries * sizeof(float));
  l.token_entries = take(entries * sizeof(int));
  l.chunk_done = take(std::size_t(moe::down_row_chunks(hidden)) * sizeof(int));
  l.act_in = take(std::size_t(max_batch) * (hidden / 256) * q4k::kActBlockBytes);
  l.act_mid = take(entries * (inter / 256) * q4k::kActBlockBytes);
  l.y = take(entries * std::size_t(hidden) * sizeof(float));
  l.total = at;
  return l;
}

// The streams of the gate/up and down kernels: as many ring slots per warp as fit in each block's
// share of shared memory (at most kMaxRingSlots). The general plan runs kStreamBlocksPerSm blocks
// per SM with entries per pass as many as leave at least kWantSlots (or, when none does,
// kMinSlots), sized for max_batch, so one capture serves any routing. A batch of at most
// kTokensPerPass tokens first tries a plan of its own: passes as wide as the batch (no expert is
// ever split), both stream kernels at kSmallBatchBlocks blocks per SM, whose smaller rings start
// each block's first item sooner (and at Kimi B = 1 give every down block one item too), and the
// work list built inside the stream blocks (no prepare kernel:
// one kernel boundary fewer between the routing and the first weights). It is taken only where
// every gate/up block gets at most one item (Kimi: B = 1); with several items per block the
// general plan is faster (bench/notes/).
struct StreamPlan {
  moe::StreamShape gate_up, down;
  int tokens = 0, gate_up_grid = 0, down_grid = 0;
  int blocks_per_sm = moe::kStreamBlocksPerSm;  // of both stream kernels
  std::size_t gate_up_smem = 0, down_smem = 0;
};

constexpr int kWantSlots = 4, kMinSlots = 2, kSmallBatchBlocks = 3;

// What the plan depends on: the SM count and the opt-in shared memory per block.
struct DeviceLimits {
  int sms;
  std::size_t smem_per_block;
};
DeviceLimits current_limits() { return {detail::sm_count(), std::size_t(detail::max_shared_memory_per_block())}; }

// Fills shape (k_blocks, tokens, gather set) for `items` items at blocks_per_sm blocks per SM;
// false if fewer than min_slots fit.
bool fit_stream(const DeviceLimits& dev, moe::StreamShape& shape, std::int64_t items, int min_slots, int blocks_per_sm, int& grid,
                std::size_t& smem) {
  grid = int(std::max<std::int64_t>(1, std::min<std::int64_t>(items, std::int64_t(dev.sms) * blocks_per_sm)));
  shape.slot_blocks = moe::stream_slot_blocks(shape.k_blocks);
  shape.max_items = int((items + grid - 1) / grid);
  min_slots = std::min(min_slots, shape.max_items * shape.pieces_per_item());  // no deeper than a block's whole work
  constexpr std::size_t kReservedPerBlock = 1024;  // the runtime's shared memory per block
  const std::size_t limit =
      dev.smem_per_block / blocks_per_sm - (blocks_per_sm > 1 ? kReservedPerBlock : 0);
  for (shape.slots = moe::kMaxRingSlots; shape.slots >= min_slots; --shape.slots) {
    smem = moe::StreamSmem(nullptr, shape).bytes;
    if (smem <= limit) return true;
  }
  return false;
}

// Both streams for `tokens` entries per pass over the passes of `batch` tokens; in_block: each
// block holds a list of `batch` tokens' entries and builds it in its ring; row_sets: down at one
// token in row sets (in-block lists only).
bool fit_plan(const DeviceLimits& dev, const MoeExpertsParams& a, int batch, int tokens, int blocks_per_sm, int min_slots,
              bool in_block, bool row_sets, StreamPlan& plan) {
  const int passes = moe::max_passes(batch, a.num_experts, a.num_shared, a.top_k, tokens);
  plan.tokens = tokens;
  plan.blocks_per_sm = blocks_per_sm;
  const int list_passes = in_block ? passes : 0, list_entries = in_block ? batch * (a.top_k + a.num_shared) : 0;
  plan.gate_up = {a.hidden / 256, 0, 0, tokens, 0, true, list_passes, list_entries};
  plan.down = {a.inter / 256, 0, 0, tokens, 0, false, list_passes, list_entries};
  plan.down.row_sets = row_sets && in_block && batch == 1;
  if (!fit_stream(dev, plan.gate_up, std::int64_t(passes) * moe::gate_up_row_groups(a.inter), min_slots, blocks_per_sm,
                  plan.gate_up_grid, plan.gate_up_smem) ||
      !fit_stream(dev, plan.down, moe::down_items(passes, a.num_shared, a.hidden, plan.down.row_sets), min_slots, blocks_per_sm,
                  plan.down_grid, plan.down_smem))
    return false;
  if (in_block)
    for (const moe::StreamShape* shape : {&plan.gate_up, &plan.down})
      if (std::size_t(kWarpsPerBlock) * shape->slots * shape->slot_bytes() < moe::prepare_smem_bytes()) return false;
  // The combine stages its chunk list and the entry lists in the (then idle) down ring.
  const std::size_t combine =
      moe::combine_chunk_list_bytes(plan.down.max_items) + moe::combine_lists_bytes(a.max_batch, a.top_k + a.num_shared);
  return std::size_t(kWarpsPerBlock) * plan.down.slots * plan.down.slot_bytes() >= combine;
}

Status plan_streams(const DeviceLimits& dev, const MoeExpertsParams& a, StreamPlan& plan) {
  // Passes as wide as the batch: one per used expert.
  const std::int64_t small_items = std::int64_t(std::min(a.num_experts, a.batch * a.top_k) + a.num_shared) * moe::gate_up_row_groups(a.inter);
  if (a.batch <= moe::kTokensPerPass && small_items <= std::int64_t(dev.sms) * kSmallBatchBlocks &&
      fit_plan(dev, a, a.batch, a.batch, kSmallBatchBlocks, kMinSlots, true, true, plan))  // (one token: row sets, down_body)
    return {};
  for (int min_slots : {kWantSlots, kMinSlots})
    for (int tokens = std::min(moe::kTokensPerPass, a.max_batch); tokens >= 1; --tokens)
      if (fit_plan(dev, a, a.max_batch, tokens, moe::kStreamBlocksPerSm, min_slots, false, false, plan)) return {};
  return Status(StatusCode::kUnsupported, detail::concat("moe_experts: hidden = ", a.hidden, ", inter = ", a.inter,
                                                         ": the expert streams do not fit in shared memory"));
}

// The streams' tensor maps: every expert's rows (routed, then shared) of each matrix as 4-byte
// words, boxes of one warp's rows x one slot.
Status encode_stream_maps(const moe::StreamShape& shape, const void* const (&mats)[2], const char* const (&names)[2], int rows,
                          std::int64_t row_bytes, moe::StreamMaps& maps) {
  for (int m = 0; m < shape.matrices(); ++m)
    ENCORE_RETURN_IF_ERROR(detail::encode_tensor_map_2d_words(&maps.mat[m], mats[m], std::uint64_t(row_bytes / 4), std::uint64_t(rows),
                                                              std::uint64_t(row_bytes), std::uint32_t(shape.pitch() / 4),
                                                              std::uint32_t(shape.box_rows()), names[m]));
  return {};
}

// The device params of the expert stage for `tokens_per_pass` entries per pass (workspace pieces
// at experts_layout's offsets).
ExpertsTileParams experts_tile_params(const MoeExpertsParams& a, int tokens_per_pass) {
  const ExpertsLayout layout = experts_layout(a.max_batch, a.num_experts, a.num_shared, a.top_k, a.hidden, a.inter);
  char* ws = static_cast<char*>(a.workspace);
  ExpertsTileParams p{};
  p.num_experts = a.num_experts;
  p.num_shared = a.num_shared;
  p.top_k = a.top_k;
  p.hidden = a.hidden;
  p.inter = a.inter;
  p.hidden_blocks = a.hidden / 256;
  p.inter_blocks = a.inter / 256;
  p.batch = a.batch;
  p.h = a.h;
  p.gamma = a.norm_weight;
  p.eps = a.norm_eps;
  p.h_settled = a.h_settled;
  p.x = a.x;
  p.ids = a.topk_ids;
  p.weights = a.topk_weights;
  p.slot_ids = a.slot_ids;
  p.error_flag = a.error_flag;
  p.tokens_per_pass = tokens_per_pass;
  p.num_passes = reinterpret_cast<int*>(ws + layout.num_passes);
  p.passes = reinterpret_cast<int4*>(ws + layout.passes);
  p.pass_capacity = moe::max_passes(a.max_batch, a.num_experts, a.num_shared, a.top_k, 1);
  p.entry_token = reinterpret_cast<int*>(ws + layout.entry_token);
  p.entry_weight = reinterpret_cast<float*>(ws + layout.entry_weight);
  p.token_entries = reinterpret_cast<int*>(ws + layout.token_entries);
  p.chunk_done = reinterpret_cast<int*>(ws + layout.chunk_done);
  p.act_in = ws + layout.act_in;
  p.act_mid = ws + layout.act_mid;
  p.y = reinterpret_cast<float*>(ws + layout.y);
  return p;
}

// The streams' tensor maps: gate and up over [E+S][inter] rows of hidden / 256 blocks, down over
// [E+S][hidden] rows of inter / 256.
Status encode_experts_maps(const MoeExpertsParams& a, const moe::StreamShape& gate_up, const moe::StreamShape& down,
                           moe::StreamMaps& gate_up_maps, moe::StreamMaps& down_maps) {
  const int matrices = a.num_experts + a.num_shared;
  ENCORE_RETURN_IF_ERROR(encode_stream_maps(gate_up, {a.gate, a.up}, {"gate", "up"}, matrices * a.inter, q4k::row_bytes(a.hidden),
                                            gate_up_maps));
  return encode_stream_maps(down, {a.down, nullptr}, {"down", nullptr}, matrices * a.hidden, q4k::row_bytes(a.inter), down_maps);
}

Status validate_batch(const char* op, int batch, int max_batch) {
  ENCORE_REQUIRE(max_batch >= 1 && max_batch <= kMaxMoeBatch, StatusCode::kOutOfRange, op, ": max_batch must be in [1, ",
                 kMaxMoeBatch, "] (got ", max_batch, ")");
  ENCORE_REQUIRE(batch >= 1 && batch <= max_batch, StatusCode::kOutOfRange, op, ": batch must be in [1, ", max_batch,
                 "] (got ", batch, ")");
  return {};
}

Status validate_norm(const char* op, const float* norm_weight, float eps) {
  if (!norm_weight) return {};
  ENCORE_RETURN_IF_ERROR(detail::check_pointer(op, norm_weight, 16, "norm_weight"));
  ENCORE_REQUIRE(std::isfinite(eps) && eps > 0.f, StatusCode::kInvalidArgument, op, ": norm_eps must be finite and > 0 (got ", eps, ")");
  return {};
}

Status validate_outputs(const char* op, const MoeRoutingConfig& c, int batch, const int* ids, const float* weights) {
  ENCORE_RETURN_IF_ERROR(detail::check_pointer(op, ids, 4, "topk_ids"));
  ENCORE_RETURN_IF_ERROR(detail::check_pointer(op, weights, 4, "topk_weights"));
  const std::size_t bytes = std::size_t(batch) * c.top_k * 4;
  ENCORE_RETURN_IF_ERROR(detail::check_disjoint(op, {ids, bytes, "topk_ids"}, {weights, bytes, "topk_weights"}));
  return {};
}

RouterTopkParams topk_params(const MoeRoutingConfig& c, const float* logits, int slices, const float* bias, int batch,
                             int* ids, float* weights, float* logits_out, const int* slot_ids) {
  RouterTopkParams t{};
  t.config = c, t.logits = logits, t.slices = slices, t.bias = bias, t.batch = batch;
  t.ids = ids, t.weights = weights, t.logits_out = logits_out, t.slot_ids = slot_ids;
  return t;
}

// One instantiation per top-k form (validate_routing_config bounds E by 512 = 32 x 16).
Status launch_fused_router(const RouterGemvParams& g, const RouterTopkParams& t, int* counter, cudaStream_t stream) {
  const int tiles = moe::router_gemv_tiles(g);
  const std::size_t smem = moe::router_fused_smem_bytes(t.config, g);
  return moe::with_topk_form(moe::fused_topk_form(t.config, t.batch), [&](auto f) {
    auto* kernel = g.batch == 1 ? router_fused_kernel<decltype(f), 1> : router_fused_kernel<decltype(f), moe::kRouterTokensPerRound>;
    return detail::launch(kernel, tiles, smem, stream, true, "moe router kernel", g, t, counter);
  });
}

Status launch_topk(const RouterTopkParams& t, cudaStream_t stream) {
  const moe::TopkForm form = moe::topk_form(t.config);
  const int tiles = moe::router_topk_tiles(t.batch, form);
  const std::size_t smem = moe::router_topk_smem_bytes(t.config);
  return moe::with_topk_form(form, [&](auto f) {
    return detail::launch(router_topk_kernel<decltype(f)>, tiles, smem, stream, true, "moe router top-k kernel", t);
  });
}

}  // namespace

// ---- routing ------------------------------------------------------------------------------------

Status validate_routing_config(const MoeRoutingConfig& c) {
  ENCORE_REQUIRE(c.num_experts >= 1 && c.num_experts <= kMaxMoeExperts, StatusCode::kInvalidArgument,
                 "moe routing: num_experts must be in [1, ", kMaxMoeExperts, "] (got ", c.num_experts, ")");
  ENCORE_REQUIRE(c.top_k >= 1 && c.top_k <= kMaxMoeTopK, StatusCode::kInvalidArgument, "moe routing: top_k must be in [1, ",
                 kMaxMoeTopK, "] (got ", c.top_k, ")");
  ENCORE_REQUIRE(c.top_k <= c.num_experts, StatusCode::kInvalidArgument, "moe routing: top_k = ", c.top_k,
                 " exceeds num_experts = ", c.num_experts);
  ENCORE_REQUIRE(c.n_group >= 1 && c.n_group <= kMaxMoeGroups, StatusCode::kInvalidArgument, "moe routing: n_group must be in [1, ",
                 kMaxMoeGroups, "] (got ", c.n_group, ")");
  ENCORE_REQUIRE(c.num_experts % c.n_group == 0, StatusCode::kInvalidArgument, "moe routing: n_group = ", c.n_group,
                 " does not divide num_experts = ", c.num_experts);
  ENCORE_REQUIRE(c.topk_group >= 1 && c.topk_group <= c.n_group, StatusCode::kInvalidArgument,
                 "moe routing: topk_group must be in [1, n_group = ", c.n_group, "] (got ", c.topk_group, ")");
  ENCORE_REQUIRE(c.top_k <= std::int64_t(c.topk_group) * (c.num_experts / c.n_group), StatusCode::kInvalidArgument,
                 "moe routing: top_k = ", c.top_k, " exceeds the experts of the kept groups (", c.topk_group, " x ",
                 c.num_experts / c.n_group, ")");
  ENCORE_REQUIRE(c.score == MoeScoreFunc::kSigmoid || c.score == MoeScoreFunc::kSoftmax, StatusCode::kInvalidArgument,
                 "moe routing: unknown score function");
  ENCORE_REQUIRE(std::isfinite(c.renorm_eps) && c.renorm_eps >= 0.f, StatusCode::kInvalidArgument,
                 "moe routing: renorm_eps must be finite and >= 0");
  ENCORE_REQUIRE(std::isfinite(c.routed_scale), StatusCode::kInvalidArgument, "moe routing: routed_scale must be finite");
  return {};
}

// [slices][batch][E] partial logits, then [slices][batch] partial sums of h^2 (fused RMSNorm).
std::size_t moe_router_workspace_bytes(int batch, int num_experts, int hidden) {
  return std::size_t(router_slices(hidden)) * std::max(batch, 0) * (std::max(num_experts, 0) + 1) * sizeof(float);
}

Status moe_router_validate(const MoeRouterParams& a) {
  const char* op = "moe_router";
  ENCORE_RETURN_IF_ERROR(validate_routing_config(a.config));
  ENCORE_RETURN_IF_ERROR(validate_batch(op, a.batch, kMaxMoeBatch));
  ENCORE_REQUIRE(a.hidden >= 256 && a.hidden % 256 == 0 && a.hidden <= (1 << 20), StatusCode::kInvalidArgument, op,
                 ": hidden must be a positive multiple of 256 up to 2^20 (got ", a.hidden, ")");
  ENCORE_REQUIRE(a.weight_dtype == MoeRouterDtype::kBf16 || a.weight_dtype == MoeRouterDtype::kFp32,
                 StatusCode::kInvalidArgument, op, ": unknown router weight dtype");
  const int E = a.config.num_experts;
  ENCORE_RETURN_IF_ERROR(detail::check_pointer(op, a.weight, 16, "router weight"));
  ENCORE_RETURN_IF_ERROR(detail::check_pointer(op, a.h, 16, "h"));
  ENCORE_RETURN_IF_ERROR(validate_norm(op, a.norm_weight, a.norm_eps));
  if (a.bias) ENCORE_RETURN_IF_ERROR(detail::check_pointer(op, a.bias, 4, "bias"));
  ENCORE_RETURN_IF_ERROR(validate_outputs(op, a.config, a.batch, a.topk_ids, a.topk_weights));
  if (a.logits) ENCORE_RETURN_IF_ERROR(detail::check_pointer(op, a.logits, 4, "logits"));
  if (a.slot_ids) ENCORE_RETURN_IF_ERROR(detail::check_pointer(op, a.slot_ids, 4, "slot_ids"));
  if (a.counter) ENCORE_RETURN_IF_ERROR(detail::check_pointer(op, a.counter, 4, "counter"));
  ENCORE_RETURN_IF_ERROR(detail::check_pointer(op, a.workspace, 16, "workspace"));
  const std::size_t need = moe_router_workspace_bytes(a.batch, E, a.hidden);
  ENCORE_REQUIRE(a.workspace_bytes >= need, StatusCode::kOutOfRange, op, ": workspace holds ", a.workspace_bytes,
                 " bytes, needs ", need);
  // Every output against every input and the other outputs.
  const std::size_t w_bytes = std::size_t(E) * a.hidden * (a.weight_dtype == MoeRouterDtype::kBf16 ? 2 : 4);
  const std::size_t h_bytes = std::size_t(a.batch) * a.hidden * 4, slot_bytes = std::size_t(a.batch) * a.config.top_k * 4;
  const std::size_t logit_bytes = std::size_t(a.batch) * E * 4;
  ENCORE_RETURN_IF_ERROR(detail::check_disjoint(
      op,
      {{a.weight, w_bytes, "router weight"}, {a.h, h_bytes, "h"}, {a.bias, std::size_t(E) * 4, "bias"},
       {a.slot_ids, std::size_t(a.batch) * 4, "slot_ids"}, {a.norm_weight, std::size_t(a.hidden) * 4, "norm_weight"}},
      {{a.topk_ids, slot_bytes, "topk_ids"}, {a.topk_weights, slot_bytes, "topk_weights"}, {a.logits, logit_bytes, "logits"},
       {a.workspace, need, "workspace"}, {a.counter, a.counter ? sizeof(std::int32_t) : 0, "counter"}}));
  return {};
}

namespace {
// The two kernels' device params (validated a).
moe::RouterPlan router_plan(const MoeRouterParams& a) {
  moe::RouterPlan r{};
  RouterGemvParams& g = r.gemv;
  g.weight = a.weight;
  g.weight_bf16 = a.weight_dtype == MoeRouterDtype::kBf16;
  g.h = a.h;
  g.gamma = a.norm_weight;
  g.hidden_blocks = a.hidden / 256;
  g.slices = router_slices(a.hidden);
  g.batch = a.batch;
  g.num_experts = a.config.num_experts;
  g.partial = static_cast<float*>(a.workspace);
  g.sum_squares = g.partial + std::size_t(g.slices) * a.batch * g.num_experts;
  r.topk = topk_params(a.config, g.partial, g.slices, a.bias, a.batch, a.topk_ids, a.topk_weights, a.logits, a.slot_ids);
  if (a.norm_weight) r.topk.sum_squares = g.sum_squares, r.topk.hidden = a.hidden, r.topk.eps = a.norm_eps;
  r.topk_form = moe::topk_form(a.config);
  r.topk_smem = moe::router_topk_smem_bytes(a.config);
  r.counter = a.batch <= kMoeRouterOnePassMaxBatch ? a.counter : nullptr;
  r.fused_form = moe::fused_topk_form(a.config, a.batch);
  r.fused_smem = moe::router_fused_smem_bytes(a.config, g);
  return r;
}
}  // namespace

Status moe_router(const MoeRouterParams& a, cudaStream_t stream) {
  ENCORE_RETURN_IF_ERROR(moe_router_validate(a));
  ENCORE_RETURN_IF_ERROR(detail::check_stream(stream));
  const moe::RouterPlan r = router_plan(a);
  if (r.counter) return launch_fused_router(r.gemv, r.topk, r.counter, stream);
  auto* gemv = r.gemv.batch == 1 ? router_gemv_kernel<1> : router_gemv_kernel<moe::kRouterTokensPerRound>;
  ENCORE_RETURN_IF_ERROR(detail::launch(gemv, moe::router_gemv_tiles(r.gemv), moe::router_gemv_smem_bytes(r.gemv), stream, true,
                                        "moe router gemv kernel", r.gemv));
  return launch_topk(r.topk, stream);
}

Status moe_topk_validate(const MoeTopkParams& a) {
  const char* op = "moe_topk";
  ENCORE_RETURN_IF_ERROR(validate_routing_config(a.config));
  ENCORE_RETURN_IF_ERROR(validate_batch(op, a.batch, kMaxMoeBatch));
  ENCORE_RETURN_IF_ERROR(detail::check_pointer(op, a.logits, 4, "logits"));
  if (a.bias) ENCORE_RETURN_IF_ERROR(detail::check_pointer(op, a.bias, 4, "bias"));
  if (a.slot_ids) ENCORE_RETURN_IF_ERROR(detail::check_pointer(op, a.slot_ids, 4, "slot_ids"));
  ENCORE_RETURN_IF_ERROR(validate_outputs(op, a.config, a.batch, a.topk_ids, a.topk_weights));
  const std::size_t logit_bytes = std::size_t(a.batch) * a.config.num_experts * 4, slot_bytes = std::size_t(a.batch) * a.config.top_k * 4;
  ENCORE_RETURN_IF_ERROR(detail::check_disjoint(
      op,
      {{a.logits, logit_bytes, "logits"}, {a.bias, std::size_t(a.config.num_experts) * 4, "bias"},
       {a.slot_ids, std::size_t(a.batch) * 4, "slot_ids"}},
      {{a.topk_ids, slot_bytes, "topk_ids"}, {a.topk_weights, slot_bytes, "topk_weights"}}));
  return {};
}

Status moe_topk(const MoeTopkParams& a, cudaStream_t stream) {
  ENCORE_RETURN_IF_ERROR(moe_topk_validate(a));
  ENCORE_RETURN_IF_ERROR(detail::check_stream(stream));
  return launch_topk(topk_params(a.config, a.logits, 1, a.bias, a.batch, a.topk_ids, a.topk_weights, nullptr, a.slot_ids), stream);
}

// ---- experts ------------------------------------------------------------------------------------

std::size_t moe_experts_workspace_bytes(int max_batch, int num_experts, int num_shared, int top_k, int hidden, int inter) {
  if (max_batch < 1 || num_experts < 1 || num_shared < 0 || top_k < 1 || hidden < 256 || inter < 256) return 0;
  return experts_layout(max_batch, num_experts, num_shared, top_k, hidden, inter).total;
}

namespace {
// The shape and batch checks (no pointers): all the plan needs.
Status validate_experts_dims(const MoeExpertsParams& a) {
  const char* op = "moe_experts";
  ENCORE_REQUIRE(a.num_experts >= 1 && a.num_experts <= kMaxMoeExperts, StatusCode::kInvalidArgument, op,
                 ": num_experts must be in [1, ", kMaxMoeExperts, "] (got ", a.num_experts, ")");
  ENCORE_REQUIRE(a.num_shared >= 0 && a.num_shared <= kMaxMoeShared, StatusCode::kInvalidArgument, op,
                 ": num_shared must be in [0, ", kMaxMoeShared, "] (got ", a.num_shared, ")");
  ENCORE_REQUIRE(a.top_k >= 1 && a.top_k <= kMaxMoeTopK && a.top_k <= a.num_experts, StatusCode::kInvalidArgument, op,
                 ": top_k must be in [1, min(", kMaxMoeTopK, ", num_experts)] (got ", a.top_k, ")");
  ENCORE_REQUIRE(a.hidden >= 256 && a.hidden % 256 == 0 && a.hidden <= (1 << 16), StatusCode::kInvalidArgument, op,
                 ": hidden must be a positive multiple of 256 up to 65536 (got ", a.hidden, ")");
  ENCORE_REQUIRE(a.inter >= 256 && a.inter % 256 == 0 && a.inter <= kMaxMoeInter, StatusCode::kInvalidArgument, op,
                 ": inter must be a multiple of 256 in [256, ", kMaxMoeInter, "] (got ", a.inter, ")");
  return validate_batch(op, a.batch, a.max_batch);
}
}  // namespace

Status moe_experts_plan(const MoeExpertsParams& a, MoeExpertsPlan* out, int sm_count, std::size_t smem_per_block) {
  ENCORE_REQUIRE(out, StatusCode::kInvalidArgument, "moe_experts_plan: null output");
  ENCORE_RETURN_IF_ERROR(validate_experts_dims(a));
  ENCORE_REQUIRE((sm_count == 0) == (smem_per_block == 0) && sm_count >= 0, StatusCode::kInvalidArgument,
                 "moe_experts_plan: give both sm_count and smem_per_block (> 0), or neither (the current device)");
  const DeviceLimits dev = sm_count > 0 ? DeviceLimits{sm_count, smem_per_block} : current_limits();
  StreamPlan plan;
  ENCORE_RETURN_IF_ERROR(plan_streams(dev, a, plan));
  *out = {plan.gate_up.in_block(), plan.blocks_per_sm, plan.gate_up_grid, plan.down_grid, plan.tokens, plan.gate_up.slots, plan.down.slots,
          plan.down.row_sets};
  return {};
}

Status moe_experts_validate(const MoeExpertsParams& a) {
  const char* op = "moe_experts";
  ENCORE_RETURN_IF_ERROR(validate_experts_dims(a));
  ENCORE_RETURN_IF_ERROR(detail::check_pointer(op, a.gate, 16, "gate"));
  ENCORE_RETURN_IF_ERROR(detail::check_pointer(op, a.up, 16, "up"));
  ENCORE_RETURN_IF_ERROR(detail::check_pointer(op, a.down, 16, "down"));
  ENCORE_RETURN_IF_ERROR(detail::check_pointer(op, a.h, 16, "h"));
  ENCORE_RETURN_IF_ERROR(validate_norm(op, a.norm_weight, a.norm_eps));
  ENCORE_RETURN_IF_ERROR(detail::check_pointer(op, a.x, 4, "x"));
  ENCORE_RETURN_IF_ERROR(detail::check_pointer(op, a.topk_ids, 4, "topk_ids"));
  ENCORE_RETURN_IF_ERROR(detail::check_pointer(op, a.topk_weights, 4, "topk_weights"));
  ENCORE_RETURN_IF_ERROR(detail::check_pointer(op, a.workspace, 16, "workspace"));
  if (a.error_flag) ENCORE_RETURN_IF_ERROR(detail::check_pointer(op, a.error_flag, 4, "error_flag"));
  if (a.slot_ids) ENCORE_RETURN_IF_ERROR(detail::check_pointer(op, a.slot_ids, 4, "slot_ids"));
  const ExpertsLayout layout = experts_layout(a.max_batch, a.num_experts, a.num_shared, a.top_k, a.hidden, a.inter);
  ENCORE_REQUIRE(a.workspace_bytes >= layout.total, StatusCode::kOutOfRange, op, ": workspace holds ", a.workspace_bytes,
                 " bytes, needs ", layout.total, " for max_batch = ", a.max_batch);

  const std::int64_t matrices = a.num_experts + a.num_shared;
  const std::size_t stack_bytes = std::size_t(matrices) * q4k::row_bytes(a.hidden) * a.inter;  // gate, up and down alike
  const std::size_t x_bytes = std::size_t(a.batch) * a.hidden * 4, slot_bytes = std::size_t(a.batch) * a.top_k * 4;
  // h may be x itself (read before x is updated): then x stands for both.
  ENCORE_RETURN_IF_ERROR(detail::check_disjoint(
      op,
      {{a.gate, stack_bytes, "gate"}, {a.up, stack_bytes, "up"}, {a.down, stack_bytes, "down"},
       {a.h == a.x ? nullptr : a.h, x_bytes, "h"}, {a.topk_ids, slot_bytes, "topk_ids"}, {a.topk_weights, slot_bytes, "topk_weights"},
       {a.slot_ids, std::size_t(a.batch) * 4, "slot_ids"}, {a.norm_weight, std::size_t(a.hidden) * 4, "norm_weight"}},
      {{a.x, x_bytes, "x"}, {a.workspace, layout.total, "workspace"}, {a.error_flag, 4, "error_flag"}}));
  // The streams' shared-memory plan depends on the device: checked here so that a pipeline's
  // validation (set_batch) reports it before any stage runs.
  StreamPlan plan;
  return plan_streams(current_limits(), a, plan);
}

Status moe_experts(const MoeExpertsParams& a, cudaStream_t stream) {
  ENCORE_RETURN_IF_ERROR(moe_experts_validate(a));
  ENCORE_RETURN_IF_ERROR(detail::check_stream(stream));
  const ExpertsLayout layout = experts_layout(a.max_batch, a.num_experts, a.num_shared, a.top_k, a.hidden, a.inter);
  StreamPlan plan;
  ENCORE_RETURN_IF_ERROR(plan_streams(current_limits(), a, plan));

  const ExpertsTileParams p = experts_tile_params(a, plan.tokens);
  moe::StreamMaps gate_up_maps{}, down_maps{};
  ENCORE_RETURN_IF_ERROR(encode_experts_maps(a, plan.gate_up, plan.down, gate_up_maps, down_maps));

  // The general plan's grids depend on max_batch only, so one capture at max_batch serves any
  // routing; the small-batch plan (in-block lists) is the batch's own.
  if (plan.gate_up.in_block()) {
    // One token: passes of one entry (as the megakernel's one-token tier) and down in row sets; the same sums.
    auto small = [&](auto pass) -> Status {
      constexpr int kPass = decltype(pass)::value;
      ENCORE_RETURN_IF_ERROR(detail::launch(moe_gate_up_kernel<kSmallBatchBlocks, true, kPass>, plan.gate_up_grid, plan.gate_up_smem,
                                            stream, true, "moe gate/up kernel", p, plan.gate_up, gate_up_maps));
      return detail::launch(moe_down_kernel<kSmallBatchBlocks, true, kPass>, plan.down_grid, plan.down_smem, stream, true,
                            "moe down kernel", p, plan.down, down_maps);
    };
    return a.batch == 1 ? small(std::integral_constant<int, 1>{}) : small(std::integral_constant<int, moe::kTokensPerPass>{});
  }
  const int prepare = moe::prepare_tiles(a.max_batch);
  ENCORE_RETURN_IF_ERROR(detail::launch(moe_prepare_kernel, prepare, moe::prepare_smem_bytes(), stream, true,
                                        "moe prepare kernel", p, prepare));
  ENCORE_RETURN_IF_ERROR(detail::launch(moe_gate_up_kernel<moe::kStreamBlocksPerSm, false>, plan.gate_up_grid, plan.gate_up_smem,
                                        stream, true, "moe gate/up kernel", p, plan.gate_up, gate_up_maps));
  return detail::launch(moe_down_kernel<moe::kStreamBlocksPerSm, false>, plan.down_grid, plan.down_smem, stream, true,
                        "moe down kernel", p, plan.down, down_maps);
}

}  // namespace encore::ops

namespace encore::moe {

Status plan_router(const ops::MoeRouterParams& a, RouterPlan* out) {
  ENCORE_RETURN_IF_ERROR(ops::moe_router_validate(a));
  *out = ops::router_plan(a);
  return {};
}

Status plan_experts_for_grid(const ops::MoeExpertsParams& a, int blocks, std::size_t smem_per_block, bool in_block,
                             ExpertsPlan* out) {
  ENCORE_RETURN_IF_ERROR(ops::validate_experts_dims(a));
  ENCORE_REQUIRE(blocks >= 1 && smem_per_block > 0, StatusCode::kInvalidArgument, "moe_experts: a plan needs blocks >= 1 and shared memory");
  ENCORE_REQUIRE(!in_block || a.batch <= kTokensPerPass, StatusCode::kInvalidArgument, "moe_experts: the in-block plan takes at most ",
                 kTokensPerPass, " tokens (got ", a.batch, ")");
  const ops::DeviceLimits grid{blocks, smem_per_block};
  // Passes as wide as the batch (in-block), or the widest that fits.
  const int widest = in_block ? a.batch : std::min(kTokensPerPass, a.batch), narrowest = in_block ? a.batch : 1;
  ops::StreamPlan plan;
  for (int min_slots : {ops::kWantSlots, ops::kMinSlots})
    for (int tokens = widest; tokens >= narrowest; --tokens)
      if (ops::fit_plan(grid, a, a.batch, tokens, 1, min_slots, in_block, false, plan)) {
        *out = {ops::experts_tile_params(a, plan.tokens), plan.gate_up, plan.down, plan.gate_up_smem, plan.down_smem};
        return {};
      }
  return Status(StatusCode::kUnsupported, detail::concat("moe_experts: hidden = ", a.hidden, ", inter = ", a.inter, ": the ",
                                                         in_block ? "in-block " : "", "expert streams do not fit in ", smem_per_block,
                                                         " bytes per block"));
}

Status encode_experts_maps(const ops::MoeExpertsParams& a, const ExpertsPlan& plan, StreamMaps* gate_up, StreamMaps* down) {
  return ops::encode_experts_maps(a, plan.gate_up, plan.down, *gate_up, *down);
}

}  // namespace encore::moe
