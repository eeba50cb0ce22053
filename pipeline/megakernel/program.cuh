// The megakernel's program: one decode step as a table of instructions in global memory. Each
// instruction names an op body (opcode), carries that body's device params as planned for the
// megakernel's grid, its tile count, and its producers: earlier instructions and how many of their
// tiles must be done this step, split into the producers its prologue needs (waited before the
// prologue) and the rest (the body's wait()). Built on the host by lower.cu from the pipeline's
// stage table; run by kernel.cuh.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda.h>

#include <encore/ops/kda.h>
#include <encore/ops/mla.h>
#include <encore/pipeline/stage_params.h>

#include "gemv/gemv_params.cuh"
#include "moe/moe_expert_stream.cuh"
#include "moe/moe_router_tile.cuh"

namespace encore::pipeline::megakernel {

enum class Opcode : std::int32_t {
  kEmbed,
  kGemv,             // rms / plain / gate-up Q4_K GEMV (gemv_body)
  kKda,
  kMlaSched,
  kMlaQAbsorb,
  kMlaKvAppend,
  kMlaSplitKv,
  kMlaCombine,
  kMlaVUp,
  kRouterGemv,       // MoE router logits (partial sums per K slice)
  kRouterTopk,       // top-k of every token (a warp per token)
  kMoeList,          // the expert work list (batches above 8 tokens)
  kMoeQuantize,      // the experts' int8 input rows (batches above 8 tokens)
  kMoeGateUp,        // expert gate/up items (up to 8 tokens: each block builds the list, quantises the input)
  kMoeDown,          // expert down items + the ordered combine into x (up to 8 tokens: each block builds the list)
  kCount,
};

// Wait until `need` tiles of instruction `instruction` (which has `per_step` tiles) are done in
// the current step: its counter reaches step * per_step + need.
struct Dep {
  std::int32_t instruction;
  std::int32_t need;
  std::int32_t per_step;
};
inline constexpr int kMaxDeps = 8;

struct GemvOp {
  gemv::GemvTileParams p;
  std::int32_t matrices;  // 1, or 2 (gate/up)
};
struct SplitKvOp {
  ops::MlaAttentionParams p;
  const CUtensorMap* pages;  // the page pool's map in the program's map table
};
struct RouterTopkOp {
  moe::RouterTopkParams p;
  moe::TopkForm form;
};
struct ExpertsOp {
  moe::ExpertsTileParams p;
  moe::StreamShape shape;
  const moe::StreamMaps* maps;  // in the program's map table
};

union OpParams {
  EmbedParams embed;
  GemvOp gemv;
  ops::KdaParams kda;
  ops::MlaSchedParams mla_sched;
  ops::MlaQAbsorbParams mla_q_absorb;
  ops::MlaKvAppendParams mla_kv_append;
  SplitKvOp mla_splitkv;
  ops::MlaAttentionParams mla_combine;
  ops::MlaVUpParams mla_v_up;
  moe::RouterGemvParams router_gemv;
  RouterTopkOp router_topk;
  moe::ExpertsTileParams moe_experts;  // list, quantize
  ExpertsOp moe_stream;                // gate/up, down
  OpParams() : embed{} {}
};

// What every block reads of every instruction, in one 16-byte load.
struct alignas(16) Header {
  Opcode op = Opcode::kEmbed;
  std::int32_t tiles = 0;        // per step; block b runs lane (b + lane_offset) mod grid if < lanes
  std::int16_t lane_offset = 0;
  std::int16_t lanes = 0;        // blocks that run it (<= grid, <= tiles); a lane takes tiles lane, lane + lanes, ...
  std::int16_t early_deps = 0;   // deps[0, early_deps): waited before the prologue
  std::int16_t late_deps = 0;    // deps[early_deps, early_deps + late_deps): the body's wait()
};
static_assert(sizeof(Header) == 16);

struct alignas(16) Instruction {
  Header h;
  Dep deps[kMaxDeps] = {};
  OpParams params;
};

// Device memory the kernel keeps between launches (zeroed at build): the step counter, the exit
// count that advances it, the stop flag, one tile counter per instruction (a 128-byte line each),
// and per block the report of a wait that timed out.
struct WaitReport {
  std::uint32_t aborted;      // nonzero: this block's wait timed out and the launch ended early
  std::int32_t instruction;   // the waiting instruction
  std::int32_t lane;          // its lane (first tile) on the waiting block
  std::int32_t producer;      // the instruction it waited for
  std::uint32_t target;       // the count it waited for
  std::uint32_t seen;         // the count it last saw
  std::uint32_t step;
};
inline constexpr int kCounterStride = 32;  // uint32 per counter: one 128-byte line each

// Trace mode: when each block reached an instruction, was released by its producers, and
// signalled its tiles (globaltimer ns; zero where the block had no tile).
struct TraceEntry {
  std::uint64_t start, ready, end;
};

// Trace mode, the bodies' marks (common/body.cuh, device::Mark): per block, up to kMarksPerBlock in
// the order they were made; the block's count (which may exceed the capacity: the rest are lost)
// is written when it leaves the launch.
struct MarkEntry {
  std::uint64_t ns;
  std::uint32_t value;
  std::int32_t instruction, item;
  std::uint32_t mark;
};
inline constexpr int kMarksPerBlock = 4096;

// The kernel's shared memory: two instruction slots, the handoff word (common/body.cuh: 1 + the
// instruction whose body left shared memory for the next one, 0 for none), the block's schedule
// (the instructions it has a tile of, in order), then what the bodies carve (split-KV aligns its
// part itself). Small: the largest bodies leave only about 2 KB of the block's shared memory free.
inline constexpr std::size_t kReservedSmem = 1920;
inline constexpr int kMaxProgram =
    int((kReservedSmem - 2 * sizeof(Instruction) - sizeof(std::uint32_t)) / sizeof(std::uint16_t)) - 1;
struct SmemLayout {
  Instruction* slots[2];  // (kernel.cuh indexes them from the base as well)
  std::uint32_t* handoff;
  std::uint16_t* schedule;  // [0]: length, then instruction indices
  char* body;
  __host__ __device__ explicit SmemLayout(char* base) {
    slots[0] = reinterpret_cast<Instruction*>(base);
    slots[1] = slots[0] + 1;
    handoff = reinterpret_cast<std::uint32_t*>(slots[0] + 2);
    schedule = reinterpret_cast<std::uint16_t*>(handoff + 1);
    body = base + kReservedSmem;
  }
};

// A device schedule entry: the instruction's index, and whether this block has already waited in
// this launch for every one of its early (or late) producers, itself or through a producer that
// implies it (Program::waited); the kernel then skips that wait.
inline constexpr std::uint16_t kScheduleIndexMask = 0x3FFF;
inline constexpr std::uint16_t kEarlyWaited = 0x8000, kLateWaited = 0x4000;
static_assert(kMaxProgram <= kScheduleIndexMask);

struct KernelArgs {
  const Instruction* program;
  std::int32_t count;
  // Per block, the instructions it runs: [grid][count + 1], row = {length, entries...} (an entry:
  // index | kEarlyWaited | kLateWaited). Not used in stress mode, where every launch maps lanes
  // afresh (and every wait polls).
  const std::uint16_t* schedule;
  std::uint32_t* step;        // [0]: steps completed, [1]: blocks that finished a step, [2]: stop (a wait timed out)
  std::uint32_t* done;        // [count * kCounterStride]: tiles done, monotonic over steps
  WaitReport* report;         // [grid]
  std::uint64_t wait_timeout_ns;  // 0: unbounded
  std::uint32_t stress_seed;      // nonzero: permuted lanes and random producer delays
  bool skip_bodies;               // the chain-only probe (MegakernelOptions::chain_only)
  TraceEntry* trace;              // [count][grid], or null
  MarkEntry* marks;               // [grid][kMarksPerBlock] (with trace), or null
  std::uint32_t* mark_counts;     // [grid]
};

}  // namespace encore::pipeline::megakernel
