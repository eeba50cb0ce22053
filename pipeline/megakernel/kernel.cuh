// The megakernel: one cooperative launch runs a whole decode step. Every block walks the program in
// order; for each instruction it takes its lane (a block-to-tile map), waits for the producers its
// prologue needs, runs the op's body (the same one the standalone kernel runs, with a wait policy
// that acquires the producers' counters), and adds its tiles to the instruction's counter.
//
// Deadlock freedom: a block only waits on instructions that come before the one it is in, and all
// blocks are resident (cooperative launch), so the earliest instruction anyone waits on always has
// its producers running. Ordering: a producer's threads write, the block synchronises, one thread
// adds to the counter with release semantics; a consumer's thread polls with acquire loads, then
// the block synchronises before anyone reads. Every block that signals an instruction
// has waited for all of its producers first, so a consumer may rely on transitive completion (the
// program keeps only the dependencies no other one implies). Counters only grow: a step waits for
// step * tiles + need (wrap-safe 32-bit compares), and the last block out of a step advances the
// step counter for the next launch.
//
// Included by two translation units, each compiled separately (-rdc) with its own register cap:
// kernel.cu (one block per SM: every body may use the whole register file) and
// kernel_two_per_sm.cu (two blocks per SM: at most 128 registers per thread). Everything here is
// in an anonymous namespace, so each unit has its own copy of the bodies.
#pragma once

#include <type_traits>

#include "pipeline/megakernel/kernel.h"

#include "common/body.cuh"
#include "common/counters.cuh"
#include "gemv/gemv_tile.cuh"
#include "kda/kda_tile.cuh"
#include "mla/mla_splitkv_tile.cuh"
#include "mla/mla_tiles.cuh"
#include "moe/moe_expert_stream.cuh"
#include "moe/moe_work_list.cuh"
#include "moe/moe_router_tile.cuh"
#include "pipeline/megakernel/program.cuh"
#include "pipeline/step_tiles.cuh"

// The unit's residency (kernel_two_per_sm.cu defines it as 2 before including this file, and is
// compiled at 128 registers).
#ifndef ENCORE_MEGAKERNEL_BLOCKS_PER_SM
#define ENCORE_MEGAKERNEL_BLOCKS_PER_SM 1
#endif
// Whether the unit's bodies record their marks (kernel_trace.cu, the traced launches): elsewhere
// the marks compile away, so a normal launch's bodies carry none of their code or registers.
#ifndef ENCORE_MEGAKERNEL_MARKS
#define ENCORE_MEGAKERNEL_MARKS 0
#endif

namespace encore::pipeline::megakernel {
namespace {

using encore::device::TileRange;

// What the residency changes, none of it a bit of the results: the router GEMV's tokens per round
// (four need more than the 128 registers of two blocks per SM; never more than the token tier, so
// a one-token step runs no code for absent tokens) and split-KV's tile shape (the op's needs more
// than half an SM's shared memory; the lowering plans the same one).
constexpr int kUnitBlocksPerSm = ENCORE_MEGAKERNEL_BLOCKS_PER_SM;
constexpr bool kUnitMarks = ENCORE_MEGAKERNEL_MARKS;
static_assert(kUnitBlocksPerSm == 1 || kUnitBlocksPerSm == 2);
constexpr int kRouterTokensPerRound = kUnitBlocksPerSm == 1 ? moe::kRouterTokensPerRound : 2;
constexpr int router_tokens_per_round(int tier) { return tier < kRouterTokensPerRound ? tier : kRouterTokensPerRound; }
// The expert streams' entries per pass: never more than the token tier (no code for absent
// entries); the tiers from kTokensPerPass up share one form.
constexpr int expert_pass_entries(int tier) { return tier < moe::kTokensPerPass ? tier : moe::kTokensPerPass; }
using SplitKvTile = std::conditional_t<kUnitBlocksPerSm == 1, mla::SplitKvConfig, mla::SplitKvHalfSm>;

// The counters' loads and adds (common/counters.cuh): the poll that sees a count is an acquire
// load, so what follows is ordered with no fence.
using encore::device::add_release_gpu;
using encore::device::load_acquire_gpu;
using encore::device::load_relaxed_gpu;
using encore::device::global_ns;
__device__ __forceinline__ bool reached(std::uint32_t seen, std::uint32_t target) { return std::int32_t(seen - target) >= 0; }

__device__ __forceinline__ std::uint32_t mix(std::uint32_t x) {
  x ^= x >> 16, x *= 0x7feb352du, x ^= x >> 15, x *= 0x846ca68bu, x ^= x >> 16;
  return x;
}

// The slow path of a wait: polls (acquire) until the count is reached, backing off after a while.
// Returns true when the launch must end: this wait timed out (it records where) or another
// block's did. Inline: a call inside a body would make the registers it keeps across the wait
// spill, and serialise the split-KV body's wgmma pipeline.
__device__ __forceinline__ bool spin(const KernelArgs& a, const std::uint32_t* counter, std::uint32_t target, int instruction,
                                  int lane, int producer, std::uint32_t step) {
  const std::uint64_t start = global_ns();
  unsigned sleep_ns = 0;
  for (int polls = 1;; ++polls) {
    if (sleep_ns) __nanosleep(sleep_ns);
    const std::uint32_t seen = load_acquire_gpu(counter);
    if (reached(seen, target)) return false;
    if (polls % 64 != 0) continue;
    sleep_ns = sleep_ns ? min(2 * sleep_ns, 256u) : 32u;
    const bool stopped = load_relaxed_gpu(a.step + 2) != 0;  // another block's wait timed out
    if (stopped || (a.wait_timeout_ns && global_ns() - start > a.wait_timeout_ns)) {
      // Every block still waiting reports its wait (the host names the earliest instruction: the
      // others wait, directly or not, on it), and the first to time out tells all to stop.
      WaitReport& r = a.report[blockIdx.x];
      r.instruction = instruction, r.lane = lane, r.producer = producer, r.target = target, r.seen = seen, r.step = step;
      r.aborted = 1;
      __threadfence();
      if (!stopped) atomicExch(a.step + 2, 1u);
      return true;
    }
  }
}

// Waits for deps[0, count): thread t polls dep t. Ends the block (every thread) when the launch
// is being abandoned.
__device__ __forceinline__ void wait_deps(const KernelArgs& a, const Dep* deps, int count, std::uint32_t step, int instruction,
                                          int lane) {
  if (count == 0) return;
  bool abort = false;
  if (int(threadIdx.x) < count) {
    const Dep d = deps[threadIdx.x];
    const std::uint32_t target = step * std::uint32_t(d.per_step) + std::uint32_t(d.need);
    const std::uint32_t* counter = a.done + std::int64_t(d.instruction) * kCounterStride;
    if (!reached(load_acquire_gpu(counter), target)) abort = spin(a, counter, target, instruction, lane, d.instruction, step);
  }
  if (__syncthreads_or(abort)) asm volatile("exit;");
  // Producers wrote with ordinary stores; some consumers read through the TMA engine (the expert
  // streams' activations, split-KV's newest cache page): order the async proxy after the acquire.
  asm volatile("fence.proxy.async.global;" ::: "memory");
}

// The bodies' wait policy in the megakernel: the instruction's producers, once. kMarks: it records
// the bodies' marks (device::Marks), in the marks unit only.
template <bool kMarks>
struct CounterWaitOf {
  static constexpr bool kSharedMemoryReused = true;
  static constexpr bool kPrologueExposed = true;
  static constexpr bool kLatencyExposed = true;
  const KernelArgs& a;
  const Dep* deps;
  int count;
  std::uint32_t step;
  int instruction, lane;
  bool waited = false;
  std::uint32_t marks = 0;  // (thread 0, trace mode) the block's marks so far in this launch
  std::uint32_t* handoff = nullptr;  // the block's handoff word (SmemLayout)
  __device__ __forceinline__ void operator()() {
    if (waited) return;
    waited = true;
    wait_deps(a, deps, count, step, instruction, lane);
    if (a.trace && threadIdx.x == 0) a.trace[std::int64_t(instruction) * gridDim.x + blockIdx.x].ready = global_ns();
  }
  // Shared memory left for the block's next instruction (device::leave_handoff): thread 0 notes the
  // instruction; every body's end and the next one's start are a block barrier apart.
  __device__ __forceinline__ void leave_handoff() const {
    if (threadIdx.x == 0) *handoff = std::uint32_t(instruction) + 1u;
  }
  __device__ __forceinline__ bool handoff_from_previous() const { return *handoff == std::uint32_t(instruction); }
  // The bodies' marks (device::mark): thread 0 appends to its block's list.
  __device__ __forceinline__ bool marking() const
    requires kMarks
  {
    return a.marks != nullptr && threadIdx.x == 0;
  }
  __device__ __forceinline__ void mark(device::Mark m, int item, std::uint32_t value)
    requires kMarks
  {
    if (!marking()) return;
    if (marks < std::uint32_t(kMarksPerBlock))
      a.marks[std::int64_t(blockIdx.x) * kMarksPerBlock + marks] = {global_ns(), value, instruction, item, std::uint32_t(m)};
    ++marks;
  }
};
using CounterWait = CounterWaitOf<kUnitMarks>;

// Which lane of instruction i block b runs. Stress mode: a fresh affine permutation of the blocks
// per instruction and step (a multiplier coprime with the grid).
__device__ __forceinline__ int lane_of(const KernelArgs& a, const Header& h, int i, std::uint32_t step) {
  const int grid = int(gridDim.x), b = int(blockIdx.x);
  if (a.stress_seed == 0) return (b + h.lane_offset) % grid;
  const std::uint32_t r = mix(a.stress_seed ^ mix(step * 0x9E3779B9u + std::uint32_t(i)));
  int mul = grid > 1 ? 1 + int(r % std::uint32_t(grid - 1)) : 1;
  auto gcd = [](int x, int y) {
    while (y) {
      const int t = x % y;
      x = y, y = t;
    }
    return x;
  };
  while (gcd(mul, grid) != 1) mul = mul % (grid - 1) + 1;
  return int((std::int64_t(mul) * b + (r >> 16)) % grid);
}

template <int NTOK, class Wait>
__device__ void run_gemv(const GemvOp& op, const TileRange& r, char* smem, Wait& wait) {
  using gemv::Core;
  const gemv::GemvTileParams& p = op.p;
  // The 16-token program also runs the fp16 core's wide tier (17..32 rows, one matrix: the only
  // plan there).
  if constexpr (NTOK == gemv::kMaxCoreTokens)
    if (p.batch > NTOK) return gemv::gemv_body<gemv::kWideTokens, 1, Core::kMmaF16>(p, r, smem, wait);
  if constexpr (NTOK >= 8) {
    if (gemv::core_of(p) == Core::kMmaS8)
      return op.matrices == 2 ? gemv::gemv_body<NTOK, 2, Core::kMmaS8>(p, r, smem, wait)
                              : gemv::gemv_body<NTOK, 1, Core::kMmaS8>(p, r, smem, wait);
    if (gemv::core_of(p) == Core::kMmaF16)
      return op.matrices == 2 ? gemv::gemv_body<NTOK, 2, Core::kMmaF16>(p, r, smem, wait)
                              : gemv::gemv_body<NTOK, 1, Core::kMmaF16>(p, r, smem, wait);
  }
  if (op.matrices == 2)
    gemv::gemv_body<NTOK, 2, Core::kDp4a>(p, r, smem, wait);
  else
    gemv::gemv_body<NTOK, 1, Core::kDp4a>(p, r, smem, wait);
}


// The block's dynamic shared memory. Bodies reach it through this symbol, not through a pointer
// argument: the compiler then knows their accesses are to shared memory (a generic pointer passed
// into a called function would make every one a generic access).
extern __shared__ __align__(1024) char megakernel_smem[];

// One opcode's body on the block's lane, as its own function: inlined into the instruction loop,
// the bodies' register needs add up into heavy spills; called (and compiled separately, -rdc), each
// keeps its own allocation. The params are read in place from the instruction's shared-memory slot
// (local copies would cost registers and stack in every body).
template <Opcode kOp, int NTOK = 1>
__device__ __noinline__ void run_op(int slot, const TileRange r, CounterWait& wait) {
  const Instruction& ins = reinterpret_cast<const Instruction*>(megakernel_smem)[slot];  // (SmemLayout's slots)
  char* smem = megakernel_smem + kReservedSmem;
  if constexpr (kOp == Opcode::kEmbed) {
    const EmbedParams& p = ins.params.embed;
    embed_body(p, r, wait);
  } else if constexpr (kOp == Opcode::kGemv) {
    run_gemv<NTOK>(ins.params.gemv, r, smem, wait);
  } else if constexpr (kOp == Opcode::kKda) {
    const ops::KdaParams& p = ins.params.kda;
    if (p.head_dim == 128)
      kda::kda_body<128>(p, r, smem, wait);
    else
      kda::kda_body<64>(p, r, smem, wait);
  } else if constexpr (kOp == Opcode::kMlaSched) {
    const ops::MlaSchedParams& p = ins.params.mla_sched;
    mla::mla_sched_body(p, r, smem, wait);
  } else if constexpr (kOp == Opcode::kMlaQAbsorb) {
    const ops::MlaQAbsorbParams& p = ins.params.mla_q_absorb;
    mla::mla_q_absorb_body(p, r, smem, wait);
  } else if constexpr (kOp == Opcode::kMlaKvAppend) {
    const ops::MlaKvAppendParams& p = ins.params.mla_kv_append;
    mla::mla_kv_append_body(p, r, smem, wait);
  } else if constexpr (kOp == Opcode::kMlaSplitKv) {
    const SplitKvOp& op = ins.params.mla_splitkv;
    mla::mla_splitkv_body<mla::SplitKvVariant::kOp, false, SplitKvTile>(op.p, op.pages, r, smem, wait);
  } else if constexpr (kOp == Opcode::kMlaCombine) {
    const ops::MlaAttentionParams& p = ins.params.mla_combine;
    mla::mla_combine_body(p, r, smem, wait);
  } else if constexpr (kOp == Opcode::kMlaVUp) {
    const ops::MlaVUpParams& p = ins.params.mla_v_up;
    mla::mla_v_up_body<NTOK>(p, r, wait);
  } else if constexpr (kOp == Opcode::kRouterGemv) {
    const moe::RouterGemvParams& p = ins.params.router_gemv;
    moe::router_gemv_body<router_tokens_per_round(NTOK)>(p, r, smem, wait);
  } else if constexpr (kOp == Opcode::kRouterTopk) {
    const RouterTopkOp& op = ins.params.router_topk;
    moe::with_topk_form(op.form, [&](auto f) { moe::router_topk_body<decltype(f)>(op.p, r, smem, wait); });
  } else if constexpr (kOp == Opcode::kMoeList) {
    const moe::ExpertsTileParams& p = ins.params.moe_experts;
    moe::work_list_body(p, r, smem, wait);
  } else if constexpr (kOp == Opcode::kMoeQuantize) {
    const moe::ExpertsTileParams& p = ins.params.moe_experts;
    moe::quantize_body(p, r, smem, wait);
  } else if constexpr (kOp == Opcode::kMoeGateUp) {
    const ExpertsOp& op = ins.params.moe_stream;
    constexpr int kPass = expert_pass_entries(NTOK);
    if (op.shape.in_block())  // (the split gate/up's two streams: the same body, shape.set read at run time)
      moe::gate_up_body<true, moe::ExpertSet::kFromShape, kPass>(op.p, op.shape, *op.maps, r, smem, wait);
    else
      moe::gate_up_body<false, moe::ExpertSet::kAll, kPass>(op.p, op.shape, *op.maps, r, smem, wait);
  } else if constexpr (kOp == Opcode::kMoeDown) {
    const ExpertsOp& op = ins.params.moe_stream;
    constexpr int kPass = expert_pass_entries(NTOK);
    // (whole row chunks at every batch, as planned: moe_plan.h)
    if (op.shape.in_block())
      moe::down_chunks_body<true, kPass>(op.p, op.shape, *op.maps, r, smem, wait);
    else
      moe::down_chunks_body<false, kPass>(op.p, op.shape, *op.maps, r, smem, wait);
  }
}

template <int NTOK>
__device__ __forceinline__ void run(int slot, Opcode op, const TileRange r, CounterWait& wait) {
  switch (op) {
    case Opcode::kEmbed: return run_op<Opcode::kEmbed>(slot, r, wait);
    case Opcode::kGemv: return run_op<Opcode::kGemv, NTOK>(slot, r, wait);
    case Opcode::kKda: return run_op<Opcode::kKda>(slot, r, wait);
    case Opcode::kMlaSched: return run_op<Opcode::kMlaSched>(slot, r, wait);
    case Opcode::kMlaQAbsorb: return run_op<Opcode::kMlaQAbsorb>(slot, r, wait);
    case Opcode::kMlaKvAppend: return run_op<Opcode::kMlaKvAppend>(slot, r, wait);
    case Opcode::kMlaSplitKv: return run_op<Opcode::kMlaSplitKv>(slot, r, wait);
    case Opcode::kMlaCombine: return run_op<Opcode::kMlaCombine>(slot, r, wait);
    case Opcode::kMlaVUp: return run_op<Opcode::kMlaVUp, mla::v_up_tokens_per_round(NTOK)>(slot, r, wait);
    // (one instantiation per distinct round: the tiers above it share it)
    case Opcode::kRouterGemv: return run_op<Opcode::kRouterGemv, router_tokens_per_round(NTOK)>(slot, r, wait);
    case Opcode::kRouterTopk: return run_op<Opcode::kRouterTopk>(slot, r, wait);
    case Opcode::kMoeList: return run_op<Opcode::kMoeList>(slot, r, wait);
    case Opcode::kMoeQuantize: return run_op<Opcode::kMoeQuantize>(slot, r, wait);
    // (one instantiation per pass size, as the router GEMV's)
    case Opcode::kMoeGateUp: return run_op<Opcode::kMoeGateUp, expert_pass_entries(NTOK)>(slot, r, wait);
    case Opcode::kMoeDown: return run_op<Opcode::kMoeDown, expert_pass_entries(NTOK)>(slot, r, wait);
    default: __trap();  // a corrupt program
  }
}

// Copies instruction `i` into a shared-memory slot with 16-byte cp.async (one group, no wait).
__device__ __forceinline__ void stage_instruction(const KernelArgs& a, int i, Instruction* slot) {
  constexpr int kChunks = int(sizeof(Instruction) / 16);
  if (int(threadIdx.x) < kChunks)
    encore::device::cp_async_16(reinterpret_cast<int4*>(slot) + threadIdx.x, reinterpret_cast<const int4*>(a.program + i) + threadIdx.x);
  encore::device::cp_async_commit();
}

template <int NTOK, int kBlocksPerSm>
__global__ void __launch_bounds__(kBlockThreads, kBlocksPerSm) megakernel(const __grid_constant__ KernelArgs a) {
  static_assert(kBlocksPerSm == kUnitBlocksPerSm, "the bodies of this unit are planned for its residency");
  const SmemLayout layout(megakernel_smem);
  const std::uint32_t step = load_relaxed_gpu(a.step);  // written by the previous launch
  const int grid = int(gridDim.x);
  // The instructions this block runs, in order: its row of the schedule (copied into shared
  // memory), or in stress mode those whose freshly permuted lane has a tile.
  const bool stress = a.stress_seed != 0;
  if (!stress) {
    const std::uint16_t* row = a.schedule + std::int64_t(blockIdx.x) * (a.count + 1);
    const int length = row[0];
    for (int k = threadIdx.x; k <= length; k += kBlockThreads) layout.schedule[k] = row[k];
  }
  if (threadIdx.x == 0) *layout.handoff = 0;  // (shared memory is not this launch's yet)
  __syncthreads();
  // The k-th instruction this block runs, as a schedule entry (index and waited flags; a.count past
  // the last). Stress mode scans the program (cursor) and waits for every producer.
  auto entry_at = [&](int k, int& cursor) -> int {
    if (!stress) return k < layout.schedule[0] ? int(layout.schedule[1 + k]) : a.count;
    for (; cursor < a.count; ++cursor)
      if (lane_of(a, a.program[cursor].h, cursor, step) < a.program[cursor].h.lanes) return cursor++;
    return a.count;
  };
  int cursor = 0, slot = 0;
  std::uint32_t marks = 0;  // (trace mode) carried from one instruction's wait policy to the next
  int entry = entry_at(0, cursor), i = entry & kScheduleIndexMask;
  if (i < a.count) stage_instruction(a, i, layout.slots[0]);
  for (int k = 0; i < a.count; ++k) {
    const int next_entry = entry_at(k + 1, cursor), next = next_entry & kScheduleIndexMask;
    encore::device::cp_async_wait_all();
    __syncthreads();  // this instruction's slot has landed; the previous body is done with its memory
    if (next < a.count) stage_instruction(a, next, layout.slots[slot ^ 1]);  // in flight while this one runs
    const Instruction& ins = *layout.slots[slot];
    const Header h = ins.h;
    const int lane = lane_of(a, h, i, step);
    if (a.trace && threadIdx.x == 0) a.trace[std::int64_t(i) * grid + blockIdx.x].start = global_ns();
    // (producers this block has already waited for in this step: no poll, no barrier)
    CounterWait early{a, ins.deps, entry & kEarlyWaited ? 0 : h.early_deps, step, i, lane};
    early();
    const int late_deps = entry & kLateWaited ? 0 : h.late_deps;
    CounterWait late{a, ins.deps + h.early_deps, late_deps, step, i, lane, false, marks, layout.handoff};
    // Lanes stride by the instruction's lane count: an instruction may leave blocks out (the MoE
    // gate/up skips the top-k's blocks), and its tiles and dynamic items must still all be taken.
    if (!a.skip_bodies) run<NTOK>(slot, h.op, TileRange{lane, int(h.lanes)}, late);
    late();  // (a body that had nothing to read may not have waited: its signal must still imply its producers')
    marks = late.marks;
    if (stress) __nanosleep(mix(a.stress_seed + 977u * step + 131u * i + blockIdx.x) % 4096u);
    encore::device::fence_proxy_async();  // this body's generic smem writes, before the next body's copies
    __syncthreads();
    if (threadIdx.x == 0) add_release_gpu(a.done + std::int64_t(i) * kCounterStride, std::uint32_t((h.tiles - lane + h.lanes - 1) / h.lanes));
    if (a.trace && threadIdx.x == 0) a.trace[std::int64_t(i) * grid + blockIdx.x].end = global_ns();
    entry = next_entry, i = next, slot ^= 1;
  }
  if (a.marks && threadIdx.x == 0) a.mark_counts[blockIdx.x] = marks;
  // The last block out of the step advances the step counter for the next launch.
  if (threadIdx.x == 0) {
    const std::uint32_t out = atomicAdd(&a.step[1], 1u) + 1u;
    if (out == (step + 1u) * std::uint32_t(grid)) a.step[0] = step + 1u;
  }
}

// The instantiation for a token tier (1, 2, 4, 8 or 16); null for another value.
template <int kBlocksPerSm>
const void* megakernel_for_tokens(int tokens) {
  switch (tokens) {
    case 1: return reinterpret_cast<const void*>(&megakernel<1, kBlocksPerSm>);
    case 2: return reinterpret_cast<const void*>(&megakernel<2, kBlocksPerSm>);
    case 4: return reinterpret_cast<const void*>(&megakernel<4, kBlocksPerSm>);
    case 8: return reinterpret_cast<const void*>(&megakernel<8, kBlocksPerSm>);
    case 16: return reinterpret_cast<const void*>(&megakernel<16, kBlocksPerSm>);
    default: return nullptr;
  }
}

}  // namespace
}  // namespace encore::pipeline::megakernel
