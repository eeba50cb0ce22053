// The megakernel's program, lowered on the host from stage tables on fake arena bases (no GPU):
// every hazard between two instructions is covered by the dependencies (directly or through
// others, and through prologue dependencies where the prologue touches the bytes), none of the
// kept dependencies is implied by another, producers come strictly earlier, and the MoE layer is
// cut into its separate instructions.
#include <algorithm>
#include <bitset>
#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

#include <encore/pipeline/stage_list.h>
#include <encore/pipeline/weight_layout.h>

#include "pipeline/megakernel/lower.h"
#include "test_util.h"

namespace encore::pipeline::megakernel {
namespace {

void* fake(std::uintptr_t tb) { return reinterpret_cast<void*>(tb << 40); }

// The pipeline's stage table for `config` at `batch` rows, on fake arena bases.
std::vector<Stage> stages_of(const ModelConfig& config, int batch, int max_batch, ops::GemvCore core = ops::GemvCore::kAuto) {
  BufferOptions o;
  o.max_batch = max_batch, o.max_slots = 16, o.max_pages = 64, o.max_pages_per_seq = 16, o.mla_num_parts = 132;
  o.gemv_core = core;
  TensorArena weights, buffers, state;
  throw_if_error(build_weight_layout(config, weights));
  throw_if_error(build_buffer_layout(config, o, buffers));
  throw_if_error(build_state_layout(config, o, state));
  std::vector<Stage> stages;
  throw_if_error(build_stage_list({&config, &o, &weights, &buffers, &state, {fake(1), fake(2), fake(3)}, batch}, stages));
  return stages;
}

const Target kH200{132, 232448};

Program lowered(const std::vector<Stage>& stages, const Target& target = kH200) {
  Program p;
  const Status s = lower(stages, target, reinterpret_cast<const CUtensorMap*>(fake(4)), &p);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return p;
}

bool conflict(const Access& a, const Access& b) {
  return (a.write || b.write) && a.begin < a.end && b.begin < b.end && a.begin < b.end && b.begin < a.end;
}

// Checks soundness and minimality of the program's dependencies; returns its longest chain.
int check_dependencies(const Program& p) {
  const int n = int(p.instructions.size());
  constexpr int kMax = 1024;
  std::vector<std::bitset<kMax>> all(n), through_early(n);  // ancestors; ancestors via prologue deps
  std::vector<int> depth(n, 1);
  int longest = 0;
  for (int j = 0; j < n; ++j) {
    const Instruction& ins = p.instructions[j];
    const int deps = ins.h.early_deps + ins.h.late_deps;
    EXPECT_LE(deps, kMaxDeps);
    for (int d = 0; d < deps; ++d) {
      const Dep& dep = ins.deps[d];
      EXPECT_TRUE(dep.instruction >= 0 && dep.instruction < j) << p.info[j].name << " waits on a later instruction";
      if (dep.instruction < 0 || dep.instruction >= j) return -1;
      EXPECT_EQ(dep.per_step, p.instructions[dep.instruction].h.tiles);
      EXPECT_EQ(dep.need, dep.per_step) << "producers are waited for whole";
      all[j] |= all[dep.instruction], all[j].set(dep.instruction);
      if (d < ins.h.early_deps) through_early[j] |= all[dep.instruction], through_early[j].set(dep.instruction);
      depth[j] = std::max(depth[j], depth[dep.instruction] + 1);
    }
    longest = std::max(longest, depth[j]);
    for (int d = 0; d < deps; ++d)  // minimal: no kept dependency implied by another kept one
      for (int e = 0; e < deps; ++e)
        if (e != d && (d >= ins.h.early_deps || e < ins.h.early_deps))
          EXPECT_FALSE(all[ins.deps[e].instruction].test(ins.deps[d].instruction))
              << p.info[j].name << ": its dependency on " << p.info[ins.deps[d].instruction].name << " is implied";
    for (int i = 0; i < j; ++i)  // sound: every hazard ordered
      for (const Access& b : p.info[j].accesses)
        for (const Access& a : p.info[i].accesses)
          if (conflict(a, b)) {
            EXPECT_TRUE(all[j].test(i)) << p.info[j].name << " is not ordered after " << p.info[i].name;
            if (b.early) EXPECT_TRUE(through_early[j].test(i)) << p.info[j].name << "'s prologue is not ordered after " << p.info[i].name;
          }
  }
  return longest;
}

std::vector<Opcode> opcodes(const Program& p) {
  std::vector<Opcode> ops;
  for (const Instruction& i : p.instructions) ops.push_back(i.h.op);
  return ops;
}

struct Case {
  const char* name;
  ModelConfig config;
  int batch, max_batch;
  ops::GemvCore core = ops::GemvCore::kAuto;
};


TEST(MegakernelLower, ProgramsAreSoundMinimalAndOrdered) {
  const Case cases[] = {{"tiny", ModelConfig::tiny(), 3, 3},
                        {"tiny rope", ModelConfig::tiny(true), 1, 3},
                        {"kimi b1", ModelConfig::kimi_linear_48b(), 1, 16},
                        {"kimi b16", ModelConfig::kimi_linear_48b(), 16, 16},
                        {"tiny b40 (GEMVs in stages of 32 and 16)", ModelConfig::tiny(), 40, 40},
                        {"kimi b64", ModelConfig::kimi_linear_48b(), 64, 64},
                        {"kimi b16, int8 GEMV core", ModelConfig::kimi_linear_48b(), 16, 16, ops::GemvCore::kMma},
                        {"kimi b64, int8 GEMV core", ModelConfig::kimi_linear_48b(), 64, 64, ops::GemvCore::kMma}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::vector<Stage> stages = stages_of(c.config, c.batch, c.max_batch, c.core);
    const Program p = lowered(stages);
    // The GEMVs run the core the graph path's launchers run for the same stages.
    // By default the fp16 core from kGemvMmaMinBatch rows, int8 when asked, dp4a below.
    int gemvs = 0, f16 = 0, int8 = 0;
    for (const Instruction& ins : p.instructions)
      if (ins.h.op == Opcode::kGemv) {
        ++gemvs;
        f16 += ins.params.gemv.p.mma && ins.params.gemv.p.mma_f16;
        int8 += ins.params.gemv.p.mma && !ins.params.gemv.p.mma_f16;
      }
    const bool wide = c.batch >= ops::kGemvMmaMinBatch;
    // (the rest: shapes whose activations do not fit one chunk, on dp4a)
    EXPECT_GE(c.core == ops::GemvCore::kMma ? int8 : f16, wide ? gemvs * 9 / 10 : 0) << "of " << gemvs;
    EXPECT_EQ(c.core == ops::GemvCore::kMma ? f16 : int8, 0);
    if (!wide) EXPECT_EQ(f16 + int8, 0);
    ASSERT_FALSE(p.instructions.empty());
    EXPECT_EQ(p.grid, kH200.sms);
    EXPECT_LE(p.smem, kH200.smem_per_block);
    for (const MapRequest& m : p.maps) EXPECT_LE(m.slot + m.count, p.map_slots);
    EXPECT_LE(p.map_slots, map_slots_bound(stages));
    const int chain = check_dependencies(p);
    // The schedule: every lane of every instruction (its tiles, at most one per block) on one block.
    const int count = int(p.instructions.size());
    ASSERT_EQ(p.schedule.size(), std::size_t(p.grid) * (count + 1));
    std::vector<std::vector<int>> lanes(count);
    for (int b = 0; b < p.grid; ++b) {
      const std::uint16_t* row = p.schedule.data() + std::size_t(b) * (count + 1);
      for (int k = 0; k < row[0]; ++k) {
        ASSERT_LT(row[1 + k], count);
        if (k > 0) EXPECT_LT(row[k], row[1 + k]) << "block " << b << " runs its instructions out of order";
        lanes[row[1 + k]].push_back((b + p.instructions[row[1 + k]].h.lane_offset) % p.grid);
      }
    }
    for (int i = 0; i < count; ++i) {
      std::sort(lanes[i].begin(), lanes[i].end());
      const int want = p.instructions[i].h.lanes;
      EXPECT_GE(want, 1) << p.info[i].name;
      EXPECT_LE(want, std::min(p.instructions[i].h.tiles, p.grid)) << p.info[i].name;
      ASSERT_EQ(int(lanes[i].size()), want) << p.info[i].name;
      for (int l = 0; l < want; ++l) EXPECT_EQ(lanes[i][l], l) << p.info[i].name;
    }
    int levels = 0;
    for (const Stage& s : stages) levels += s.joins_previous ? 0 : 1;
    std::cout << "[ measured ] " << c.name << ": " << stages.size() << " stages, " << p.instructions.size()
              << " instructions, longest dependency chain " << chain << " (graph: " << levels << " levels), " << p.smem
              << " bytes of shared memory\n";
  }
}

// Kimi-Linear: each MoE layer is router GEMV, top-k, gate/up, down; above 8 tokens the input
// quantiser and the work list are instructions of their own (up to 8 the stream blocks build the
// list and quantise the input themselves, as the graph path's small-batch plan does).
TEST(MegakernelLower, MoeLayersAreSeparateInstructions) {
  for (int batch : {1, 8, 16}) {
    SCOPED_TRACE(batch);
    const Program p = lowered(stages_of(ModelConfig::kimi_linear_48b(), batch, 16));
    const std::vector<Opcode> ops = opcodes(p);
    const bool in_block = batch <= 8;
    const int moe_layers = ModelConfig::kimi_linear_48b().count(Mlp::kMoe);
    // The router GEMV and the top-k are two instructions at every batch (at one token the stage has
    // the one-kernel form's counter, which the lowering leaves to the graph path).
    constexpr Opcode routing = Opcode::kRouterTopk;  // the instruction that writes the routing
    // gate/up: at one token the shared experts' stream and the routed one (Kimi has a shared expert)
    EXPECT_EQ(std::count(ops.begin(), ops.end(), Opcode::kMoeGateUp), batch == 1 ? 2 * moe_layers : moe_layers);
    EXPECT_EQ(std::count(ops.begin(), ops.end(), Opcode::kMoeDown), moe_layers);
    EXPECT_EQ(std::count(ops.begin(), ops.end(), Opcode::kRouterGemv), moe_layers);
    EXPECT_EQ(std::count(ops.begin(), ops.end(), Opcode::kRouterTopk), moe_layers);
    EXPECT_EQ(std::count(ops.begin(), ops.end(), Opcode::kMoeQuantize), in_block ? 0 : moe_layers);
    EXPECT_EQ(std::count(ops.begin(), ops.end(), Opcode::kMoeList), in_block ? 0 : moe_layers);
    for (std::size_t i = 0; i < ops.size(); ++i) {
      const Instruction& ins = p.instructions[i];
      auto producers = [&](int from, int to) {
        std::vector<Opcode> v;
        for (int d = from; d < to; ++d) v.push_back(ops[ins.deps[d].instruction]);
        return v;
      };
      const std::vector<Opcode> early = producers(0, ins.h.early_deps);
      const std::vector<Opcode> late = producers(ins.h.early_deps, ins.h.early_deps + ins.h.late_deps);
      auto has = [](const std::vector<Opcode>& v, Opcode o) { return std::find(v.begin(), v.end(), o) != v.end(); };
      if (ops[i] == Opcode::kMoeDown)  // its prologue needs the work list (or the routing) only
        EXPECT_TRUE(has(early, in_block ? routing : Opcode::kMoeList)) << p.info[i].name;
      if (ops[i] == Opcode::kMoeGateUp && in_block) {  // its prologue quantises x; the routing comes after
        EXPECT_FALSE(has(early, routing) || has(early, Opcode::kRouterGemv)) << p.info[i].name;
        const bool shared = ins.params.moe_stream.shape.set == moe::ExpertSet::kShared;
        EXPECT_EQ(has(late, routing), !shared) << p.info[i].name;  // the shared experts need no routing
      }
      if (ops[i] == Opcode::kMoeGateUp || ops[i] == Opcode::kMoeDown) {  // in-block rings start at an item's pieces
        const moe::StreamShape& shape = ins.params.moe_stream.shape;
        EXPECT_EQ(shape.first_fills, in_block ? std::max(2, shape.pieces_per_item()) : 0) << p.info[i].name;
        EXPECT_LE(shape.first_fills, shape.slots) << p.info[i].name;
      }
      if (ops[i] == Opcode::kMoeQuantize)  // the experts' input needs x, not the routing
        EXPECT_FALSE(has(early, routing) || has(late, routing) || has(late, Opcode::kRouterGemv)) << p.info[i].name;
    }
  }
  // The batch-1 program above came from stages whose routers have the counter; above one token
  // they have none.
  for (int batch : {1, 8}) {
    const std::vector<Stage> stages = stages_of(ModelConfig::kimi_linear_48b(), batch, 16);
    for (const Stage& s : stages)
      if (s.kind == StageKind::kMoeRouter) EXPECT_EQ(s.params.moe_router.counter != nullptr, batch == 1) << batch;
  }
}

// Split-KV's prologue waits for the scheduler only; KDA's for nothing (settled states).
TEST(MegakernelLower, ProloguesWaitOnlyForSettledData) {
  const Program p = lowered(stages_of(ModelConfig::kimi_linear_48b(), 1, 16));
  for (std::size_t i = 0; i < p.instructions.size(); ++i) {
    const Instruction& ins = p.instructions[i];
    if (ins.h.op == Opcode::kMlaSplitKv) {
      ASSERT_EQ(ins.h.early_deps, 1) << p.info[i].name;
      EXPECT_EQ(p.instructions[ins.deps[0].instruction].h.op, Opcode::kMlaSched);
    }
    if (ins.h.op == Opcode::kKda || ins.h.op == Opcode::kGemv || ins.h.op == Opcode::kMlaSched) {
      EXPECT_EQ(ins.h.early_deps, 0) << p.info[i].name;
    }
  }
}

// Kimi's top-k runs a block per token (sigmoid scores, no group stage); up to 8 tokens its blocks
// reach gate/up only once the routing is out, and every other block waits there for it. So gate/up
// leaves those blocks out and hands their items to the others: all of them still run (the lanes
// stride by the lane count), and down takes every block, its light lanes on the blocks with
// gate/up's heavy ones.
TEST(MegakernelLower, SharedExpertsRunBesideTheRoutingAndTheTopkBlockSkipsGateUp) {
  {  // Above one token gate/up stays one stream, right after the top-k, without the top-k's blocks.
    const Program p = lowered(stages_of(ModelConfig::kimi_linear_48b(), 8, 16));
    const int count = int(p.instructions.size());
    int layers = 0;
    for (int i = 1; i < count; ++i) {
      if (p.instructions[i].h.op != Opcode::kMoeGateUp) continue;
      ++layers;
      EXPECT_EQ(p.instructions[i].params.moe_stream.shape.set, moe::ExpertSet::kAll) << p.info[i].name;
      ASSERT_EQ(p.instructions[i - 1].h.op, Opcode::kRouterTopk) << p.info[i].name;
      EXPECT_EQ(p.instructions[i - 1].h.tiles, 8) << "a block per token";
      EXPECT_EQ(p.instructions[i].h.tiles, p.grid - 8) << p.info[i].name;
      for (int b = 0; b < p.grid; ++b) {
        const std::uint16_t* row = p.schedule.data() + std::size_t(b) * (count + 1);
        const auto runs = [&](int ins) { return std::find(row + 1, row + 1 + row[0], std::uint16_t(ins)) != row + 1 + row[0]; };
        EXPECT_FALSE(runs(i - 1) && runs(i)) << p.info[i].name << ": block " << b << " runs the top-k and gate/up";
      }
    }
    EXPECT_EQ(layers, ModelConfig::kimi_linear_48b().count(Mlp::kMoe));
  }
  for (int batch : {1}) {
    SCOPED_TRACE(batch);
    const Program p = lowered(stages_of(ModelConfig::kimi_linear_48b(), batch, 16));
    const int count = int(p.instructions.size());
    auto block_of_lane = [&](int i, int lane) { return ((lane - p.instructions[i].h.lane_offset) % p.grid + p.grid) % p.grid; };
    auto runs = [&](int b, int i) {
      const std::uint16_t* row = p.schedule.data() + std::size_t(b) * (count + 1);
      return std::find(row + 1, row + 1 + row[0], std::uint16_t(i)) != row + 1 + row[0];
    };
    auto depends_on = [&](int i, int producer) {
      const Header& h = p.instructions[i].h;
      for (int k = 0; k < h.early_deps + h.late_deps; ++k)
        if (p.instructions[i].deps[k].instruction == producer) return true;
      return false;
    };
    int layers = 0;
    for (int i = 3; i + 1 < count; ++i) {
      if (p.instructions[i].h.op != Opcode::kMoeGateUp || p.instructions[i].params.moe_stream.shape.set != moe::ExpertSet::kRouted)
        continue;
      ++layers;
      // router GEMV, top-k, the shared experts' gate/up, the routed experts' gate/up, down
      const int shared = i - 1, topk = i - 2, router = i - 3;
      ASSERT_EQ(p.instructions[router].h.op, Opcode::kRouterGemv) << p.info[i].name;
      ASSERT_EQ(p.instructions[topk].h.op, Opcode::kRouterTopk);
      ASSERT_EQ(p.instructions[topk].h.tiles, 1);
      ASSERT_EQ(p.instructions[shared].h.op, Opcode::kMoeGateUp);
      ASSERT_EQ(p.instructions[shared].params.moe_stream.shape.set, moe::ExpertSet::kShared);
      const ExpertsOp& op = p.instructions[i].params.moe_stream;
      EXPECT_EQ(p.instructions[shared].h.tiles, op.p.num_shared * moe::gate_up_row_groups(op.p.inter)) << p.info[shared].name;
      // The shared stream waits for no routing, and its blocks are neither the router's nor the
      // top-k's, so it runs while the routing is computed.
      EXPECT_FALSE(depends_on(shared, topk) || depends_on(shared, router)) << p.info[shared].name;
      for (int b = 0; b < p.grid; ++b)
        if (runs(b, shared)) EXPECT_FALSE(runs(b, router) || runs(b, topk)) << p.info[shared].name << ": block " << b;
      // The routed stream leaves out the top-k's block and depends on the routing, not on the
      // shared stream (their act_mid rows are disjoint); down depends on both.
      const int topk_block = block_of_lane(topk, 0);
      EXPECT_EQ(p.instructions[i].h.tiles, p.grid - 1) << p.info[i].name;
      EXPECT_FALSE(runs(topk_block, i)) << p.info[i].name;
      EXPECT_TRUE(depends_on(i, topk)) << p.info[i].name;
      EXPECT_FALSE(depends_on(i, shared)) << p.info[i].name;
      ASSERT_EQ(p.instructions[i + 1].h.op, Opcode::kMoeDown);
      EXPECT_EQ(p.instructions[i + 1].params.moe_stream.shape.set, moe::ExpertSet::kAll);
      EXPECT_TRUE(depends_on(i + 1, i) && depends_on(i + 1, shared)) << p.info[i + 1].name;
      EXPECT_EQ(p.instructions[i + 1].h.tiles, p.grid) << p.info[i + 1].name;
      EXPECT_TRUE(runs(topk_block, i + 1)) << p.info[i + 1].name;
      // Each lane's share of the most routed items a layer can have fits the planned item table.
      const int items = moe::max_passes(op.p.batch, op.p.num_experts, 0, op.p.top_k, op.p.tokens_per_pass) *
                        moe::gate_up_row_groups(op.p.inter);
      EXPECT_LE((items + p.grid - 2) / (p.grid - 1), op.shape.max_items) << p.info[i].name;
      if (batch == 1) EXPECT_LE((items + p.grid - 2) / (p.grid - 1), 2) << "routed items per lane at batch 1";
      // gate/up's heavy lanes (one item more; the last to reach down) take down's highest lanes.
      const int heavy_gate_up = items % (p.grid - 1);
      for (int lane = 0; lane < heavy_gate_up; ++lane) {
        const int down_lane = (block_of_lane(i, lane) + p.instructions[i + 1].h.lane_offset) % p.grid;
        EXPECT_GE(down_lane, p.grid - heavy_gate_up) << p.info[i + 1].name << ": gate/up lane " << lane;
      }
      // down's heavy lanes (one item more) finish last: the next layer's first instruction starts
      // on its first light lane, so an in-projection's second tiles go to the blocks free first.
      const moe::StreamShape& down = p.instructions[i + 1].params.moe_stream.shape;
      EXPECT_FALSE(down.row_sets) << "the megakernel's down runs whole row chunks";
      const int heavy_down = moe::down_items(moe::max_passes(op.p.batch, op.p.num_experts, op.p.num_shared, op.p.top_k, op.p.tokens_per_pass),
                                             op.p.num_shared, op.p.hidden, down.row_sets) % p.grid;
      // (A KDA in-projection at one token starts on the partition's first block instead.)
      if (i + 2 < count && heavy_down > 0 && !(batch == 1 && p.info[i + 2].name.ends_with("kda.in_proj")))
        EXPECT_EQ(block_of_lane(i + 2, 0), block_of_lane(i + 1, heavy_down)) << p.info[i + 2].name;
    }
    EXPECT_EQ(layers, ModelConfig::kimi_linear_48b().count(Mlp::kMoe));
  }
}

// At one token KDA's 32 tiles take blocks [0, 32) in every layer, and its projections, the
// router's GEMV and the top-k the other blocks, so each SM runs the same few bodies every layer
// (lower.cu, plan_partition); from KDA tiles above a quarter of the grid every instruction rotates.
TEST(MegakernelLower, OneTokenKeepsKdaOnItsOwnBlocks) {
  const ModelConfig kimi = ModelConfig::kimi_linear_48b();
  for (int batch : {1, 4}) {
    SCOPED_TRACE(batch);
    const Program p = lowered(stages_of(kimi, batch, 16));
    const int count = int(p.instructions.size()), heads = kimi.kda.heads;
    auto blocks_of = [&](int i) {
      std::vector<int> blocks;
      for (int lane = 0; lane < p.instructions[i].h.lanes; ++lane)
        blocks.push_back((lane - p.instructions[i].h.lane_offset + p.grid) % p.grid);
      std::sort(blocks.begin(), blocks.end());
      return blocks;
    };
    int kda = 0, beside = 0;
    for (int i = 0; i < count; ++i) {
      const Header& h = p.instructions[i].h;
      const std::string& name = p.info[i].name;
      const std::vector<int> blocks = blocks_of(i);
      if (h.op == Opcode::kKda) {
        ++kda;
        ASSERT_EQ(h.tiles, batch * heads);
        if (batch == 1) {
          ASSERT_EQ(int(blocks.size()), heads) << name;
          EXPECT_EQ(blocks.front(), 0) << name;
          EXPECT_EQ(blocks.back(), heads - 1) << name;
        }
      }
      const bool off_kda = name.ends_with("kda.in_proj") || name.ends_with("kda.o_proj") || h.op == Opcode::kRouterGemv ||
                           h.op == Opcode::kRouterTopk;
      if (batch == 1 && off_kda) {
        ++beside;
        EXPECT_GE(blocks.front(), heads) << name << " runs on KDA's blocks";
        EXPECT_EQ(h.lanes, std::min(h.tiles, p.grid - heads)) << name;
      }
      if (batch == 4 && (name.ends_with("kda.in_proj") || h.op == Opcode::kKda)) EXPECT_EQ(h.lanes, std::min(h.tiles, p.grid)) << name;
    }
    EXPECT_EQ(kda, kimi.count(Attention::kKda));
    if (batch == 1) EXPECT_EQ(beside, 2 * kimi.count(Attention::kKda) + 2 * kimi.count(Mlp::kMoe));
  }
}

// A block skips a wait only for producers it has already waited for in the step, itself or
// through a producer that implies them (every block that signals has waited for its producers);
// the down stream's early wait for the top-k, which its block's gate/up waited for, is one.
TEST(MegakernelLower, WaitsAreSkippedOnlyForProducersTheBlockHasWaitedFor) {
  for (int batch : {1, 4, 16}) {
    SCOPED_TRACE(batch);
    const Program p = lowered(stages_of(ModelConfig::kimi_linear_48b(), batch, 16));
    const int count = int(p.instructions.size());
    ASSERT_EQ(p.waited.size(), p.schedule.size());
    std::vector<std::bitset<1024>> implied(count);  // each instruction and everything it depends on
    for (int i = 0; i < count; ++i) {
      implied[i].set(i);
      const Instruction& ins = p.instructions[i];
      for (int d = 0; d < ins.h.early_deps + ins.h.late_deps; ++d) implied[i] |= implied[ins.deps[d].instruction];
    }
    int skipped_down = 0, downs = 0, waits = 0, skipped = 0;
    for (int b = 0; b < p.grid; ++b) {
      const std::size_t at = std::size_t(b) * (count + 1);
      EXPECT_EQ(p.waited[at], 0);
      std::bitset<1024> done;  // the producers this block has waited for so far
      for (int k = 1; k <= p.schedule[at]; ++k) {
        const Instruction& ins = p.instructions[p.schedule[at + k]];
        const std::uint8_t flags = p.waited[at + k];
        ASSERT_LE(flags, 3);
        for (int part = 0; part < 2; ++part) {
          const int first = part == 0 ? 0 : ins.h.early_deps, n = part == 0 ? ins.h.early_deps : ins.h.late_deps;
          if (!(flags >> part & 1)) continue;
          EXPECT_GT(n, 0) << p.info[p.schedule[at + k]].name;
          for (int d = first; d < first + n; ++d)
            EXPECT_TRUE(done.test(ins.deps[d].instruction)) << p.info[p.schedule[at + k]].name << " on block " << b;
        }
        if (ins.h.op == Opcode::kMoeDown && ins.h.early_deps > 0) ++downs, skipped_down += flags & 1;
        waits += (ins.h.early_deps > 0) + (ins.h.late_deps > 0), skipped += (flags & 1) + (flags >> 1);
        for (int d = 0; d < ins.h.early_deps + ins.h.late_deps; ++d) done |= implied[ins.deps[d].instruction];
      }
    }
    if (batch <= 4) EXPECT_GT(skipped_down, downs / 2) << "down's early wait for the routing, skipped on most blocks";
    std::printf("  [batch %d] %d of %d waits skipped (down's early wait: %d of %d)\n", batch, skipped, waits, skipped_down,
                downs);
  }
}

TEST(MegakernelLower, RejectsWhatTheTargetCannotHold) {
  const std::vector<Stage> stages = stages_of(ModelConfig::tiny(), 3, 3);
  Program p;
  const Status small = lower(stages, Target{132, 64 * 1024}, nullptr, &p);  // split-KV needs ~207 KB
  EXPECT_EQ(small.code(), StatusCode::kUnsupported);
  EXPECT_NE(small.message().find("mla.splitkv"), std::string::npos) << small.message();
  EXPECT_EQ(lower(stages, Target{0, 232448}, nullptr, &p).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(lower(stages, Target{132, 232448, 3}, nullptr, &p).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(lower(stages, kH200, nullptr, nullptr).code(), StatusCode::kNullPointer);
}

// Fewer SMs than the device's (MegakernelOptions::sms): the GEMVs keep the device's plans (the
// graph path's sums), so only the tile-to-block map changes; on 5 SMs every GEMV of the tiny model
// runs several rounds of tiles (the GPU test then compares the bits).
TEST(MegakernelLower, FewerSmsKeepTheGemvPlans) {
  for (int batch : {1, 3}) {
    SCOPED_TRACE(batch);
    const std::vector<Stage> stages = stages_of(ModelConfig::tiny(true), batch, 3);
    const Program all = lowered(stages), few = lowered(stages, Target{5, 232448, 1, 132});
    ASSERT_EQ(few.grid, 5);
    ASSERT_EQ(all.instructions.size(), few.instructions.size());
    int multi_round = 0;
    for (std::size_t i = 0; i < all.instructions.size(); ++i) {
      const Instruction &a = all.instructions[i], &f = few.instructions[i];
      ASSERT_EQ(a.h.op, f.h.op) << all.info[i].name;
      if (a.h.op != Opcode::kGemv) continue;
      const gemv::GemvTileParams &pa = a.params.gemv.p, &pf = f.params.gemv.p;
      EXPECT_EQ(a.h.tiles, f.h.tiles) << all.info[i].name;
      EXPECT_EQ(pa.row_groups, pf.row_groups) << all.info[i].name;
      EXPECT_EQ(pa.rows_per_warp, pf.rows_per_warp) << all.info[i].name;
      EXPECT_EQ(pa.slot_blocks, pf.slot_blocks) << all.info[i].name;  // (same shared memory: same slots)
      EXPECT_EQ(pa.chunk_blocks, pf.chunk_blocks) << all.info[i].name;
      EXPECT_EQ(pa.mma_part_bits, pf.mma_part_bits) << all.info[i].name;
      multi_round += f.h.tiles > few.grid;
    }
    EXPECT_GT(multi_round, 0);
  }
}

// At one block per SM, Kimi's one-token single-matrix GEMVs with K = 2304 (the KDA and MLA in-projections,
// lm_head) take slots of whole rows, which lie as in global memory (9 K blocks: no pad), so a warp's
// rows of a tile come in one copy.
TEST(MegakernelLower, OneTokenGemvsTakeWholeRowSlots) {
  const Program p = lowered(stages_of(ModelConfig::kimi_linear_48b(), 1, 16));
  int whole = 0;
  for (std::size_t i = 0; i < p.instructions.size(); ++i) {
    if (p.instructions[i].h.op != Opcode::kGemv) continue;
    const gemv::GemvTileParams& g = p.instructions[i].params.gemv.p;
    if (g.k_blocks != 9 || p.instructions[i].params.gemv.matrices != 1) continue;
    EXPECT_EQ(g.slot_blocks, g.k_blocks) << p.info[i].name;
    EXPECT_GE(g.slots, 2) << p.info[i].name;
    EXPECT_EQ(q4k::slot_pitch(g.slot_blocks), g.row_bytes) << p.info[i].name;
    ++whole;
  }
  EXPECT_GE(whole, 20 + 7 + 1);
}

// Two blocks per SM (MegakernelOptions::blocks_per_sm): twice the lanes, every body within half the
// SM's shared memory, split-KV in its tile shape for half an SM (16 heads, one page slot). Models
// fit where their GEMVs' plans do (Kimi at batches 1 and 2; from batch 3, the 4-token tier, the
// dense down projection's plan keeps all of K = 9216 in shared memory). The errors name the
// instruction.
const Target kH200TwoPerSm{132, 233472 / 2 - 1024, 2};

TEST(MegakernelLower, TwoBlocksPerSm) {
  struct Case {
    const char* name;
    ModelConfig config;
    int batch, max_batch;
  };
  const Case cases[] = {{"tiny, KDA only", ModelConfig::tiny().with_kda_for_mla(), 3, 3},
                        {"tiny", ModelConfig::tiny(), 3, 3},
                        {"tiny, rope and q LoRA", ModelConfig::tiny(true), 3, 3},
                        {"kimi b1, KDA only", ModelConfig::kimi_linear_48b().with_kda_for_mla(), 1, 16},
                        {"kimi b1", ModelConfig::kimi_linear_48b(), 1, 16}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::vector<Stage> stages = stages_of(c.config, c.batch, c.max_batch);
    const Program one = lowered(stages), two = lowered(stages, kH200TwoPerSm);
    EXPECT_EQ(two.grid, 2 * kH200.sms);
    EXPECT_LE(two.smem, kH200TwoPerSm.smem_per_block);
    ASSERT_EQ(one.instructions.size(), two.instructions.size());
    // The GEMVs run the same plan (hence the same sums) at either residency; only ring depths differ.
    for (std::size_t i = 0; i < one.instructions.size(); ++i) {
      if (one.instructions[i].h.op != Opcode::kGemv) continue;
      gemv::GemvTileParams a = one.instructions[i].params.gemv.p, b = two.instructions[i].params.gemv.p;
      EXPECT_EQ(a.row_groups, b.row_groups) << one.info[i].name;
      EXPECT_EQ(a.rows_per_warp, b.rows_per_warp) << one.info[i].name;
      EXPECT_EQ(a.chunk_blocks, b.chunk_blocks) << one.info[i].name;
      EXPECT_EQ(a.mma, b.mma) << one.info[i].name;
      EXPECT_EQ(a.mma_part_bits, b.mma_part_bits) << one.info[i].name;
      // Slots of whole rows may fit at one residency only. A K slice takes the same blocks from
      // slots that are multiples of the slices or hold all of K.
      for (const gemv::GemvTileParams* q : {&a, &b})
        if (!q->mma) EXPECT_TRUE(q->slot_blocks % (8 / q->row_groups) == 0 || q->slot_blocks >= q->k_blocks) << one.info[i].name;
      if (a.mma) EXPECT_EQ(a.slot_blocks, b.slot_blocks) << one.info[i].name;
      EXPECT_EQ(one.instructions[i].h.tiles, two.instructions[i].h.tiles) << one.info[i].name;
    }
    // The expert streams take one lane per resident block, up to their items: never fewer lanes
    // than at one block per SM, and more where the items allow.
    int wider = 0;
    for (std::size_t i = 0; i < one.instructions.size(); ++i) {
      const Opcode op = one.instructions[i].h.op;
      if (op != Opcode::kMoeGateUp && op != Opcode::kMoeDown) continue;
      EXPECT_GE(two.instructions[i].h.tiles, one.instructions[i].h.tiles) << one.info[i].name;
      EXPECT_LE(two.instructions[i].h.tiles, two.grid) << one.info[i].name;
      wider += two.instructions[i].h.tiles > one.instructions[i].h.tiles;
    }
    if (c.config.moe.experts >= 256) EXPECT_GT(wider, 0) << "no expert stream took the second block's lanes";
    // Split-KV: the same parts (so the same partials and combine), in tiles of 16 heads.
    for (std::size_t i = 0; i < one.instructions.size(); ++i) {
      if (one.instructions[i].h.op != Opcode::kMlaSplitKv) continue;
      const ops::MlaAttentionParams& t = two.instructions[i].params.mla_splitkv.p;
      EXPECT_EQ(t.num_parts, one.instructions[i].params.mla_splitkv.p.num_parts) << one.info[i].name;
      EXPECT_EQ(two.instructions[i].h.tiles, t.num_parts * ((t.num_heads + 15) / 16)) << one.info[i].name;
      EXPECT_EQ(one.instructions[i].h.tiles, t.num_parts * ((t.num_heads + 31) / 32)) << one.info[i].name;
    }
    check_dependencies(two);
  }
  Program p;
  const Status b4 = lower(stages_of(ModelConfig::kimi_linear_48b().with_kda_for_mla(), 4, 16), kH200TwoPerSm, nullptr, &p);
  EXPECT_EQ(b4.code(), StatusCode::kUnsupported);
  EXPECT_NE(b4.message().find("dense.down"), std::string::npos) << b4.message();
}

}  // namespace
}  // namespace encore::pipeline::megakernel
