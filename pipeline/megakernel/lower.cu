#include "pipeline/megakernel/lower.h"

#include <algorithm>
#include <bitset>
#include <cstdint>
#include <limits>
#include <string>

#include <encore/ops/kda.h>
#include <encore/ops/mla.h>

#include "gemv/gemv_plan.h"
#include "mla/mla_splitkv_layout.cuh"
#include "mla/mla_tiles.cuh"
#include "moe/moe_work_list.cuh"
#include "moe/moe_plan.h"

namespace encore::pipeline::megakernel {
namespace {

struct Node {
  Instruction ins;
  InstructionInfo info;  // info.accesses: what the dependencies are derived from
  // >= 0: lane 0 goes this many blocks after the previous instruction's lane 0, instead of after
  // its last lane (the MoE down lines up its light lanes with gate/up's heavy ones).
  int lane0_after_previous = -1;
  // > 0: its items are taken dynamically and lanes below this one take one item more (the MoE
  // down); the next instruction's lane 0 goes to this lane, so that its own heavy lanes (an
  // in-projection's second tiles) land on the blocks that finish first.
  int first_light_lane = 0;
  // >= 0: lane 0 on this block, whatever came before (the KDA partition, plan_partition).
  int pinned_block = -1;
  // > 0: at most this many lanes (default: one per tile, up to the grid).
  int max_lanes = 0;
};

template <class T>
Access bytes_of(const T* p, std::size_t bytes, bool write, bool early = false) {
  const auto at = reinterpret_cast<std::uintptr_t>(p);
  return {at, p ? at + bytes : at, write, early};
}
// Rows of `width` elements `stride` apart: (batch - 1) * stride + width elements.
template <class T>
Access rows_of(const T* p, int batch, std::int64_t stride, std::int64_t width, bool write, bool early = false) {
  return bytes_of(p, (std::size_t(batch - 1) * stride + width) * sizeof(T), write, early);
}
Access range_of(const void* begin, const void* end, bool write, bool early = false) {
  return {reinterpret_cast<std::uintptr_t>(begin), reinterpret_cast<std::uintptr_t>(end), write, early};
}

std::string layer_name(int layer, const char* what) {
  return layer < 0 ? std::string(what) : "blk." + std::to_string(layer) + "." + what;
}

// What a GEMV stage computes in the model.
const char* gemv_name(StageRole r) {
  switch (r) {
    case StageRole::kKdaInProj: return "kda.in_proj";
    case StageRole::kKdaOutProj: return "kda.o_proj";
    case StageRole::kMlaInProj: return "mla.in_proj";
    case StageRole::kMlaQB: return "mla.q_b";
    case StageRole::kMlaOutProj: return "mla.o_proj";
    case StageRole::kDenseGateUp: return "dense.gate_up";
    case StageRole::kDenseDown: return "dense.down";
    case StageRole::kLmHead: return "lm_head";
    default: return "gemv";
  }
}

class Lowering {
 public:
  Lowering(const std::vector<Stage>& stages, const Target& target, const CUtensorMap* maps, Program& out)
      : stages_(stages), target_(target), map_table_(maps), out_(out) {}

  Status run() {
    out_ = Program{};
    ENCORE_REQUIRE(target_.sms >= 1 && target_.smem_per_block > kReservedSmem, StatusCode::kInvalidArgument,
                   "megakernel: the target needs SMs and shared memory");
    ENCORE_REQUIRE(target_.blocks_per_sm == 1 || target_.blocks_per_sm == 2, StatusCode::kInvalidArgument,
                   "megakernel: blocks_per_sm must be 1 or 2 (got ", target_.blocks_per_sm, ")");
    out_.grid = target_.sms * target_.blocks_per_sm;
    ENCORE_REQUIRE(out_.grid <= std::numeric_limits<std::int16_t>::max(), StatusCode::kInvalidArgument, "megakernel: a grid of ",
                   out_.grid, " blocks is more than the program's lanes can name");
    plan_partition();
    // (The split-KV scheduler, which reads only the step's inputs, comes right after the gather in
    // the table, so its plan is ready long before the first MLA layer needs it.)
    for (std::size_t i = 0; i < stages_.size(); ++i) ENCORE_RETURN_IF_ERROR(lower_stage(int(i)));
    ENCORE_RETURN_IF_ERROR(link());
    const Node* largest = nullptr;
    for (Node& n : nodes_) {
      if (!largest || n.info.smem > largest->info.smem) largest = &n;
      out_.smem = std::max(out_.smem, n.info.smem);
      out_.instructions.push_back(n.ins);
      out_.info.push_back(n.info);
    }
    ENCORE_REQUIRE(out_.smem <= body_smem(), StatusCode::kUnsupported, "megakernel: ", largest ? largest->info.name : "",
                   " needs ", out_.smem, " bytes of shared memory; a block has ", body_smem(), " beside the program's ",
                   kReservedSmem, " at ", target_.blocks_per_sm, " block(s) per SM");
    out_.smem += kReservedSmem;
    // Block b runs lane (b + lane_offset) mod grid of every instruction that has that many tiles.
    const int count = int(out_.instructions.size()), grid = out_.grid;
    out_.schedule.assign(std::size_t(grid) * (count + 1), 0);
    for (int b = 0; b < grid; ++b) {
      std::uint16_t* row = out_.schedule.data() + std::size_t(b) * (count + 1);
      for (int i = 0; i < count; ++i) {
        const Header& h = out_.instructions[i].h;
        if ((b + h.lane_offset) % grid < h.lanes) row[1 + row[0]++] = std::uint16_t(i);
      }
    }
    mark_waited();
    return {};
  }

 private:
  // Where KDA's tiles take at most a quarter of the grid (Kimi at one token): KDA runs on blocks
  // [0, kda_blocks_) and its layer's projections, the router's GEMV and the top-k on the others,
  // every layer. A block then runs the same few bodies each layer (KDA and the expert streams, or
  // the GEMVs, the router and the expert streams), a working set its SM's instruction cache can
  // keep, where rotating every body over every block made each one start its layer from L2
  // (docs/megakernel.md §4). The placement changes which block runs a tile, never a sum.
  void plan_partition() {
    int kda_tiles = 0;
    for (const Stage& s : stages_)
      if (s.kind == StageKind::kKda) kda_tiles = std::max(kda_tiles, ops::kda_num_tiles(s.params.kda));
    kda_blocks_ = kda_tiles > 0 && 4 * kda_tiles <= out_.grid ? kda_tiles : 0;
  }
  // Pins a node of the partition: lane 0 on `block`, at most `lanes` lanes.
  static void pin(Node& n, int block, int lanes = 0) { n.pinned_block = block, n.max_lanes = lanes; }

  Node& add(Opcode op, int tiles, int stage, const char* what, std::size_t smem) {
    Node n;
    n.ins.h.op = op;
    n.ins.h.tiles = tiles;
    n.info = {layer_name(stages_[stage].layer, what), stage, stages_[stage].layer, smem};
    nodes_.push_back(n);
    return nodes_.back();
  }

  int take_map_slots(int count, std::function<Status(CUtensorMap*)> encode) {
    const int slot = out_.map_slots;
    out_.maps.push_back({slot, count, std::move(encode)});
    out_.map_slots += count;
    return slot;
  }

  Status lower_stage(int si) {
    const Stage& s = stages_[si];
    const StageParams& p = s.params;
    switch (s.kind) {
      case StageKind::kEmbed: {
        const EmbedParams& e = p.embed;
        Node& n = add(Opcode::kEmbed, e.batch, si, "embed", 0);
        n.ins.params.embed = e;
        n.info.accesses = {bytes_of(e.token_ids, std::size_t(e.batch) * 4, false),
                           bytes_of(e.x, std::size_t(e.batch) * e.hidden * 4, true)};
        return {};
      }
      case StageKind::kRmsNormGemv: return gemv(si, p.rms_gemv, p.rms_gemv.normalized, gemv_name(s.role));
      case StageKind::kGemv: return gemv(si, p.gemv, nullptr, gemv_name(s.role));
      case StageKind::kGateUpGemv: return gemv(si, p.gate_up, nullptr, gemv_name(s.role));
      case StageKind::kKda: return kda(si, p.kda);
      case StageKind::kMlaSched: {
        const ops::MlaSchedParams& m = p.mla_sched;
        Node& n = add(Opcode::kMlaSched, 1, si, "mla.sched", mla::mla_sched_smem_bytes(m.batch));
        n.ins.params.mla_sched = m;
        n.info.accesses = {bytes_of(m.part_plans, std::size_t(m.num_parts) * ops::kMlaPartPlanInts * 4, true),
                      bytes_of(m.num_splits, (std::size_t(m.batch) + 1) * 4, true), bytes_of(m.error_flag, 4, true)};
        return {};
      }
      case StageKind::kMlaQAbsorb: {
        const ops::MlaQAbsorbParams& q = p.mla_q_absorb;
        Node& n = add(Opcode::kMlaQAbsorb, ops::mla_q_absorb_num_tiles(q), si, "mla.q_absorb", mla::mla_q_absorb_smem_bytes());
        n.ins.params.mla_q_absorb = q;
        n.info.accesses = {rows_of(q.q, q.batch, q.q_stride, std::int64_t(q.num_heads) * ops::kMlaQHeadDim, false),
                      bytes_of(q.q576, std::size_t(q.batch) * q.num_heads * ops::kMlaRowDim * 2, true)};
        return {};
      }
      case StageKind::kMlaKvAppend: {
        const ops::MlaKvAppendParams& a = p.mla_kv_append;
        Node& n = add(Opcode::kMlaKvAppend, a.batch, si, "mla.kv_append", mla::mla_kv_append_smem_bytes());
        n.ins.params.mla_kv_append = a;
        n.info.accesses = {rows_of(a.kv_a, a.batch, a.kv_a_stride, ops::kMlaRowDim, false), bytes_of(a.error_flag, 4, false),
                      cache_of(a.cache, true)};
        return {};
      }
      case StageKind::kMlaSplitKv: return splitkv(si, p.mla_attention);
      case StageKind::kMlaCombine: {
        const ops::MlaAttentionParams& t = p.mla_attention;
        Node& n = add(Opcode::kMlaCombine, ops::mla_combine_num_tiles(t), si, "mla.combine", mla::mla_combine_smem_bytes(t.num_parts));
        n.ins.params.mla_combine = t;
        n.info.accesses = attention_accesses(t, false);
        return {};
      }
      case StageKind::kMlaVUp: {
        const ops::MlaVUpParams& v = p.mla_v_up;
        Node& n = add(Opcode::kMlaVUp, ops::mla_v_up_num_tiles(v), si, "mla.v_up", 0);
        n.ins.params.mla_v_up = v;
        n.info.accesses = {bytes_of(v.o_lat, std::size_t(v.batch) * v.num_heads * ops::kMlaLatentDim * 4, false),
                      bytes_of(v.out, std::size_t(v.batch) * v.num_heads * ops::kMlaVHeadDim * 4, true)};
        return {};
      }
      case StageKind::kMoeRouter: return router(si);
      case StageKind::kMoeExperts: return experts(si);
    }
    return Status(StatusCode::kInvalidArgument, "megakernel: stage " + std::to_string(si) + " has an unknown kind");
  }

  template <class P>
  Status gemv(int si, const P& a, const float* normalized, const char* what) {
    gemv::GemvPlan plan;
    ops::GemvLaunch launch;
    launch.core = stages_[si].gemv_core;  // the graph path's core: the same plan, hence the same sums
    ENCORE_RETURN_IF_ERROR(gemv::plan_op(a, target_.plan_sms > 0 ? target_.plan_sms : target_.sms, &plan, launch));
    // The launcher's plan (same row split and activation chunks, so the same sums) with the
    // deepest weight ring that fits beside the program: at one block per SM, one block keeps as many
    // bytes in flight as the launcher's two.
    const std::size_t budget = std::min(kGemvSmemBudget, body_smem());
    auto smem_of = [&](const gemv::GemvTileParams& q) { return gemv::GemvSmem(nullptr, q, plan.tokens, plan.matrices).bytes; };
    // Slots of whole rows (all of K) where two fit: a warp's rows of a tile then come in one copy per
    // row, or in one copy where the slot lies as in global memory (odd K blocks: no pad), not one per
    // row and slot. A K slice keeps its blocks (the launcher's slots are whole multiples of the
    // slices), so the sums stay the same.
    if (gemv::core_of(plan.params) == gemv::Core::kDp4a && plan.params.chunk_blocks == plan.params.k_blocks &&
        plan.params.slot_blocks % (8 / plan.params.row_groups) == 0) {
      gemv::GemvTileParams whole = plan.params;
      whole.slot_blocks = whole.k_blocks, whole.slots = 2;
      if (smem_of(whole) <= budget) plan.params = whole;
    }
    for (plan.params.slots = gemv::kMaxSlots; plan.params.slots > 2; --plan.params.slots)
      if (smem_of(plan.params) <= budget) break;
    plan.smem = smem_of(plan.params);
    const gemv::GemvTileParams& g = plan.params;
    // The program's tier is the GEMVs' (a wide-tier GEMV, 17..32 rows, runs in the 16-token
    // program: run_gemv).
    const int tier = std::min(plan.tokens, gemv::kMaxCoreTokens);
    if (out_.tokens != tier && gemv_seen_)
      return Status(StatusCode::kInvalidArgument, "megakernel: the stages' GEMVs run different token tiers");
    out_.tokens = tier, gemv_seen_ = true;
    Node& n = add(Opcode::kGemv, int(gemv::num_tiles(g)), si, what, plan.smem);
    n.ins.params.gemv = {g, plan.matrices};
    const StageRole role = stages_[si].role;
    if (kda_blocks_ > 0 && (role == StageRole::kKdaInProj || role == StageRole::kKdaOutProj))
      pin(n, kda_blocks_, out_.grid - kda_blocks_);
    n.info.accesses.push_back(rows_of(g.x, g.batch, g.x_stride, std::int64_t(g.k_blocks) * 256, false));
    for (int m = 0; m < 2; ++m)
      if (g.out[m]) n.info.accesses.push_back(rows_of(g.out[m], g.batch, g.out_stride, g.n, true));
    if (g.residual) n.info.accesses.push_back(rows_of(g.residual, g.batch, g.out_stride, g.n, false));
    if (normalized) n.info.accesses.push_back(bytes_of(normalized, std::size_t(g.batch) * g.k_blocks * 256 * 4, true));
    return {};
  }

  Status kda(int si, const ops::KdaParams& k) {
    Node& n = add(Opcode::kKda, ops::kda_num_tiles(k), si, "kda", ops::kda_smem_bytes(k));
    n.ins.params.kda = k;
    n.ins.params.kda.host_slot_ids = nullptr;  // (a host pointer: the pipeline checked the slots on the host)
    if (kda_blocks_ > 0) pin(n, 0);
    const std::size_t conv = std::size_t(k.num_slots) * ops::kda_conv_state_floats_per_slot(k.num_heads, k.head_dim) * 4;
    const std::size_t state = std::size_t(k.num_slots) * ops::kda_recurrent_state_floats_per_slot(k.num_heads, k.head_dim) * 4;
    n.info.accesses = {rows_of(k.proj, k.batch, k.proj_stride, ops::kda_proj_width(k), false),
                  bytes_of(k.y, std::size_t(k.batch) * k.num_heads * k.head_dim * 4, true),
                  bytes_of(k.conv_state, conv, true, k.state_settled), bytes_of(k.recurrent_state, state, true, k.state_settled)};
    if (k.error_flag) n.info.accesses.push_back(bytes_of(k.error_flag, 4, false));
    return {};
  }

  // The same bytes, read (before the wait when `early`).
  static Access read(Access a, bool early = false) {
    a.write = false, a.early = early;
    return a;
  }

  static Access cache_of(const ops::MlaPagedCache& c, bool write) {
    return bytes_of(c.pages, std::size_t(c.num_pages) * ops::kMlaPageTokens * ops::kMlaRowDim * 2, write);
  }

  // The split-KV outputs, and what split-KV (or the combine) reads of the plan and partials.
  static std::vector<Access> attention_accesses(const ops::MlaAttentionParams& t, bool splitkv) {
    const std::size_t rows = std::size_t(t.batch) * t.num_heads, parts = std::size_t(t.batch + t.num_parts) * t.num_heads;
    std::vector<Access> a = {bytes_of(t.o_lat, rows * ops::kMlaLatentDim * 4, true), bytes_of(t.lse, rows * 4, true),
                             bytes_of(t.partial_o, parts * ops::kMlaLatentDim * 4, splitkv),
                             bytes_of(t.partial_lse, parts * 4, splitkv),
                             bytes_of(t.num_splits, (std::size_t(t.batch) + 1) * 4, false, splitkv),
                             bytes_of(t.error_flag, 4, false)};
    return a;
  }

  Status splitkv(int si, const ops::MlaAttentionParams& t) {
    ENCORE_REQUIRE(t.counters == nullptr, StatusCode::kUnsupported, "megakernel: stage ", si,
                   ": the fused split-KV combine is not an instruction (run split-KV and the combine)");
    // At two blocks per SM the tiles take half the heads and one page slot (the same bits).
    const bool half_sm = target_.blocks_per_sm > 1;
    const int tiles = half_sm ? t.num_parts * mla::head_groups<mla::SplitKvHalfSm>(t.num_heads) : ops::mla_splitkv_num_tiles(t);
    const std::size_t smem = half_sm ? mla::mla_splitkv_smem_bytes<mla::SplitKvHalfSm>() : mla::mla_splitkv_smem_bytes();
    Node& n = add(Opcode::kMlaSplitKv, tiles, si, "mla.splitkv", smem);
    const ops::MlaPagedCache cache = t.cache;
    const int slot = take_map_slots(1, [cache](CUtensorMap* m) { return mla::encode_pages_map(cache, m); });
    n.ins.params.mla_splitkv = {t, map_table_ + slot};
    n.info.accesses = attention_accesses(t, true);
    n.info.accesses.push_back(bytes_of(t.part_plans, std::size_t(t.num_parts) * ops::kMlaPartPlanInts * 4, false, t.plan_settled));
    n.info.accesses.push_back(bytes_of(t.q576, std::size_t(t.batch) * t.num_heads * ops::kMlaRowDim * 2, false));
    n.info.accesses.push_back(cache_of(t.cache, false));
    return {};
  }

  Status router(int si) {
    const ops::MoeRouterParams& r = stages_[si].params.moe_router;
    moe::RouterPlan plan;
    ENCORE_RETURN_IF_ERROR(moe::plan_router(r, &plan));
    const Access h = rows_of(r.h, r.batch, r.hidden, r.hidden, false);
    const Access ws = bytes_of(static_cast<const char*>(r.workspace), r.workspace_bytes, true);
    const std::size_t slots = std::size_t(r.batch) * r.config.top_k * 4;
    std::vector<Access> routing = {bytes_of(r.topk_ids, slots, true), bytes_of(r.topk_weights, slots, true)};
    if (r.logits) routing.push_back(bytes_of(r.logits, std::size_t(r.batch) * r.config.num_experts * 4, true));
    // Its GEMV and its top-k, whether or not the stage gives the one-kernel form's counter (same
    // bits, moe.md §2): at one token the top-k's block is left out of the experts' gate/up, where
    // the one-kernel form's last block would reach gate/up last; that form measured no faster here.
    Node& g = add(Opcode::kRouterGemv, moe::router_gemv_tiles(plan.gemv), si, "moe.router", moe::router_gemv_smem_bytes(plan.gemv));
    g.ins.params.router_gemv = plan.gemv;
    g.info.accesses = {h, ws};
    Node& t = add(Opcode::kRouterTopk, moe::router_topk_tiles(r.batch, plan.topk_form), si, "moe.topk", plan.topk_smem);
    t.ins.params.router_topk = {plan.topk, plan.topk_form};
    if (kda_blocks_ > 0) {  // beside KDA's blocks, the top-k on the last ones; the shared experts' stream then starts at block 0
      pin(g, kda_blocks_, out_.grid - kda_blocks_);
      pin(t, out_.grid - std::min(t.ins.h.tiles, out_.grid - kda_blocks_), out_.grid - kda_blocks_);
    }
    t.info.accesses = {read(ws)};
    t.info.accesses.insert(t.info.accesses.end(), routing.begin(), routing.end());
    return {};
  }

  // The expert stage. Up to kTokensPerPass tokens, as the graph path runs them: every stream block
  // builds the work list from the routing itself, and the gate/up blocks quantise the input in
  // their prologue (x is settled once its writer is done, before the routing is). Larger batches:
  // the input quantiser and the work list are their own instructions.
  Status experts(int si) {
    const ops::MoeExpertsParams& m = stages_[si].params.moe_experts;
    const bool in_block = m.batch <= moe::kTokensPerPass;
    // A top-k just before (a block per token, or one for 8 tokens): its blocks would reach gate/up
    // last, their prologue then on the critical path, so gate/up leaves them out (the lanes rotate:
    // they are the last lanes' blocks).
    const int topk_blocks = in_block && !nodes_.empty() && nodes_.back().ins.h.op == Opcode::kRouterTopk &&
                                    nodes_.back().ins.h.tiles < out_.grid
                                ? nodes_.back().ins.h.tiles
                                : 0;
    const int gate_up_blocks = out_.grid - topk_blocks;
    moe::ExpertsPlan plan;  // planned for the fewer blocks: down's shape then holds its lanes' items too
    if (Status s = moe::plan_experts_for_grid(m, gate_up_blocks, body_smem(), in_block, &plan); !s.ok())
      return Status(s.code(), detail::concat(layer_name(stages_[si].layer, "moe.gate_up"), ": ", s.message()));
    // Up to 8 tokens (in-block lists, set up after the routing): an item's pieces (at least two)
    // are issued before the first item computes, the rest of the ring as items compute. The whole
    // ring at once held the first item back: every SM issues at the same moment, and the copies
    // stall at issue until the memory system takes them.
    if (in_block)
      for (moe::StreamShape* shape : {&plan.gate_up, &plan.down}) shape->first_fills = std::max(2, shape->pieces_per_item());
    // A block's down stream takes the work list its gate/up stream built, at the same offset.
    ENCORE_REQUIRE(plan.gate_up.list_passes == plan.down.list_passes && plan.gate_up.list_entries == plan.down.list_entries,
                   StatusCode::kUnsupported, layer_name(stages_[si].layer, "moe.down"), ": the streams' work lists differ in size");
    moe::ExpertsTileParams e = plan.params;
    e.h_settled = in_block;
    const char* ws_end = static_cast<const char*>(m.workspace) + m.workspace_bytes;
    ENCORE_REQUIRE(reinterpret_cast<const char*>(e.num_passes) < reinterpret_cast<const char*>(e.chunk_done) &&
                       reinterpret_cast<const char*>(e.chunk_done) < e.act_in && e.act_in < e.act_mid &&
                       e.act_mid < reinterpret_cast<const char*>(e.y) && reinterpret_cast<const char*>(e.y) < ws_end,
                   StatusCode::kInvalidArgument, "megakernel: stage ", si, ": the experts' workspace pieces are out of order");
    const Access list = range_of(e.num_passes, e.chunk_done, true), chunks = range_of(e.chunk_done, e.act_in, true);
    const Access act_in = range_of(e.act_in, e.act_mid, true), act_mid = range_of(e.act_mid, e.y, true), y = range_of(e.y, ws_end, true);
    const Access x_rows = rows_of(m.h, m.batch, m.hidden, m.hidden, false);
    const Access x_out = rows_of(m.x, m.batch, m.hidden, m.hidden, true);
    const std::size_t slots = std::size_t(m.batch) * m.top_k * 4;
    const Access ids = bytes_of(m.topk_ids, slots, false), weights = bytes_of(m.topk_weights, slots, false);
    const Access flag = bytes_of(m.error_flag, m.error_flag ? 4 : 0, true);

    if (!in_block) {
      Node& q = add(Opcode::kMoeQuantize, m.batch, si, "moe.quantize", moe::quantize_smem_bytes(m.hidden));
      q.ins.params.moe_experts = e;
      q.info.accesses = {x_rows, act_in};
      Node& l = add(Opcode::kMoeList, 1, si, "moe.list", moe::prepare_smem_bytes());
      l.ins.params.moe_experts = e;
      l.info.accesses = {ids, weights, list, chunks, flag};
    }
    const int passes = moe::max_passes(m.batch, m.num_experts, m.num_shared, m.top_k, e.tokens_per_pass);
    const int down_items = moe::down_items(passes, m.num_shared, m.hidden, plan.down.row_sets);
    const int down_lanes = std::min(out_.grid, down_items);
    const int slot = take_map_slots(4, [m, plan](CUtensorMap* maps) {
      return moe::encode_experts_maps(m, plan, reinterpret_cast<moe::StreamMaps*>(maps), reinterpret_cast<moe::StreamMaps*>(maps + 2));
    });
    const auto* maps = reinterpret_cast<const moe::StreamMaps*>(map_table_ + slot);
    // One token with shared experts: gate/up as two instructions. The shared experts' stream needs
    // no routing, so it runs on the blocks the router leaves idle while the routing is computed;
    // the routed stream, on the critical path, has fewer items per lane. Their act_mid rows are
    // disjoint (the shared entries sit after batch * top_k: moe_work_list.cuh). At 4 tokens the
    // shared item outlasts the routing and the split measured slower (bench/notes/).
    const bool split = in_block && m.batch == 1 && m.num_shared > 0 && out_.grid > 1;
    const int routed_passes = split ? moe::max_passes(m.batch, m.num_experts, 0, m.top_k, e.tokens_per_pass) : passes;
    const int gate_up_items = routed_passes * moe::gate_up_row_groups(m.inter);
    const int gate_up_lanes = std::min(gate_up_blocks, gate_up_items);
    const std::size_t mid_row = std::size_t(e.inter_blocks) * q4k::kActBlockBytes, routed_rows = std::size_t(m.batch) * m.top_k;
    const Access mid_routed = bytes_of(e.act_mid, routed_rows * mid_row, true);
    if (split) {
      const int shared_passes = m.num_shared * ((m.batch + e.tokens_per_pass - 1) / e.tokens_per_pass);
      Node& s = add(Opcode::kMoeGateUp, std::min(gate_up_blocks, shared_passes * moe::gate_up_row_groups(m.inter)), si,
                    "moe.shared_gate_up", plan.gate_up_smem);
      s.ins.params.moe_stream = {e, plan.gate_up, maps};
      s.ins.params.moe_stream.shape.set = moe::ExpertSet::kShared;
      // (x after its list, in the body's wait: the list needs only the slot ids)
      s.info.accesses = {read(x_rows), bytes_of(e.act_mid + routed_rows * mid_row, std::size_t(m.batch) * m.num_shared * mid_row, true)};
    }
    {
      Node& g = add(Opcode::kMoeGateUp, gate_up_lanes, si, "moe.gate_up", plan.gate_up_smem);
      g.ins.params.moe_stream = {e, plan.gate_up, maps};
      if (split) {
        g.ins.params.moe_stream.shape.set = moe::ExpertSet::kRouted;
        if (topk_blocks > 0) g.lane0_after_previous = 0;  // from the shared stream's first block: the top-k's are left out
      }
      if (in_block)  // the routing after the quantised input; lane 0 resets the combine's counters, reports bad ids
        g.info.accesses = {read(x_rows, true), ids, weights, chunks, flag, split ? mid_routed : act_mid};
      else
        g.info.accesses = {read(list), read(act_in), act_mid};
    }
    Node& d = add(Opcode::kMoeDown, down_lanes, si, "moe.down", plan.down_smem);
    d.ins.params.moe_stream = {e, plan.down, maps + 1};
    // A lane takes items lane, lane + lanes, ...: the low lanes get one more (counted at the most
    // passes, the batch-1 count). gate/up's are the last blocks to reach down (which waits for all
    // of gate/up) and start its ring late, so they take down's highest lanes, the light ones.
    const int heavy_gate_up = gate_up_items % gate_up_lanes;
    const int heavy_down = down_items % down_lanes;
    if (down_lanes == out_.grid && heavy_gate_up > 0 && heavy_down > 0) d.lane0_after_previous = heavy_gate_up;
    if (down_lanes == out_.grid) d.first_light_lane = heavy_down;
    if (in_block)  // its list, from the routing, before its ring starts
      d.info.accesses = {read(ids, true), read(weights, true), read(act_mid), y, chunks, x_rows, x_out};
    else
      d.info.accesses = {read(list, true), read(act_mid), y, chunks, x_rows, x_out};
    return {};
  }

  // Dependencies from conflicting accesses, reduced to those no other one implies; then each
  // instruction's first lane goes to the block after the previous instruction's last tile, so that
  // small instructions in a row land on different blocks and a multi-round instruction's heavy
  // lanes follow the previous one's light lanes (or where its node says).
  Status link() {
    const int n = int(nodes_.size());
    ENCORE_REQUIRE(n <= kMaxProgram, StatusCode::kUnsupported, "megakernel: ", n, " instructions exceed ", kMaxProgram);
    ancestors_.assign(n, {});
    int start = 0, previous_start = 0;
    for (int j = 0; j < n; ++j) {
      std::vector<int> early, late;
      for (int i = 0; i < j; ++i) {
        bool conflict = false, in_prologue = false;
        for (const Access& b : nodes_[j].info.accesses)
          for (const Access& a : nodes_[i].info.accesses)
            if ((a.write || b.write) && a.begin < b.end && b.begin < a.end && a.begin < a.end && b.begin < b.end) {
              conflict = true;
              in_prologue |= b.early;
            }
        if (conflict) (in_prologue ? early : late).push_back(i);
      }
      for (int i : early) ancestors_[j] |= ancestors_[i], ancestors_[j].set(i);
      for (int i : late) ancestors_[j] |= ancestors_[i], ancestors_[j].set(i);
      // Drop what another dependency implies: an early one only through another early one.
      auto implied = [&](int i, const std::vector<int>& by) {
        for (int k : by)
          if (k != i && ancestors_[k].test(i)) return true;
        return false;
      };
      std::vector<int> kept_early, kept_late;
      for (int i : early)
        if (!implied(i, early)) kept_early.push_back(i);
      for (int i : late)
        if (!implied(i, early) && !implied(i, late)) kept_late.push_back(i);
      Instruction& ins = nodes_[j].ins;
      ENCORE_REQUIRE(kept_early.size() + kept_late.size() <= std::size_t(kMaxDeps), StatusCode::kUnsupported, "megakernel: ",
                     nodes_[j].info.name, " has ", kept_early.size() + kept_late.size(), " producers; at most ", kMaxDeps);
      int d = 0;
      for (const std::vector<int>* list : {&kept_early, &kept_late})
        for (int i : *list) ins.deps[d++] = {i, nodes_[i].ins.h.tiles, nodes_[i].ins.h.tiles};
      ins.h.early_deps = std::int16_t(kept_early.size());
      ins.h.late_deps = std::int16_t(kept_late.size());
      ENCORE_REQUIRE(ins.h.tiles >= 1, StatusCode::kInvalidArgument, "megakernel: ", nodes_[j].info.name, " has no tiles");
      if (nodes_[j].pinned_block >= 0)
        start = nodes_[j].pinned_block;
      else if (nodes_[j].lane0_after_previous >= 0)
        start = (previous_start + nodes_[j].lane0_after_previous) % out_.grid;
      const int lanes = std::min({ins.h.tiles, out_.grid, nodes_[j].max_lanes > 0 ? nodes_[j].max_lanes : out_.grid});
      ins.h.lanes = std::int16_t(lanes);
      ins.h.lane_offset = std::int16_t((out_.grid - start) % out_.grid);
      previous_start = start;
      // The next one's lane 0 after this one's last lane: on its first light lane when it has
      // several rounds (ins.h.tiles % lanes lanes take one tile more).
      const int heavy = ins.h.tiles % lanes;
      start = (start + (nodes_[j].first_light_lane > 0 ? nodes_[j].first_light_lane : heavy > 0 ? heavy : lanes)) % out_.grid;
    }
    return {};
  }

  static constexpr int kMaxInstructions = 1024;  // (>= kMaxProgram)
  static_assert(kMaxProgram <= kMaxInstructions);
  // Shared memory a body may take: the block's, less the program's headers and slots.
  std::size_t body_smem() const { return target_.smem_per_block - kReservedSmem; }
  // What a GEMV's ring may take: the split-KV body sets the block's shared memory anyway.
  static constexpr std::size_t kGemvSmemBudget = 200 * 1024;

  // Which producers a block has waited for before each of its instructions: the deps of the
  // instructions it ran, and what those imply (every block that signals has waited for all its
  // producers first, so a count reached implies its producers' counts).
  void mark_waited() {
    const int count = int(out_.instructions.size());
    out_.waited.assign(out_.schedule.size(), 0);
    for (int b = 0; b < out_.grid; ++b) {
      const std::size_t at = std::size_t(b) * (count + 1);
      std::bitset<kMaxInstructions> waited;
      for (int k = 1; k <= out_.schedule[at]; ++k) {
        const Header& h = out_.instructions[out_.schedule[at + k]].h;
        const Dep* deps = out_.instructions[out_.schedule[at + k]].deps;
        auto all_waited = [&](int first, int n) {
          for (int d = first; d < first + n; ++d)
            if (!waited.test(deps[d].instruction)) return false;
          return n > 0;
        };
        const bool early = all_waited(0, h.early_deps), late = all_waited(h.early_deps, h.late_deps);
        out_.waited[at + k] = std::uint8_t((early ? 1 : 0) | (late ? 2 : 0));
        for (int d = 0; d < h.early_deps + h.late_deps; ++d) {
          waited |= ancestors_[deps[d].instruction];
          waited.set(deps[d].instruction);
        }
      }
    }
  }

  const std::vector<Stage>& stages_;
  const Target target_;
  const CUtensorMap* map_table_;
  Program& out_;
  std::vector<Node> nodes_;
  std::vector<std::bitset<kMaxInstructions>> ancestors_;  // (link) every instruction each one depends on
  bool gemv_seen_ = false;
  int kda_blocks_ = 0;  // > 0: KDA's blocks in the partition (plan_partition)
};

}  // namespace

int map_slots_bound(const std::vector<Stage>& stages) { return 4 * int(stages.size()); }

Status lower(const std::vector<Stage>& stages, const Target& target, const CUtensorMap* map_table, Program* out) {
  ENCORE_REQUIRE(out, StatusCode::kNullPointer, "megakernel: lower needs an output program");
  return Lowering(stages, target, map_table, *out).run();
}

}  // namespace encore::pipeline::megakernel
