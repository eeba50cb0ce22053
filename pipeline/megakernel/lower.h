// Lowering: the pipeline's stage table -> the megakernel's program (program.cuh). Host only; no GPU
// is touched, so it runs (and is tested) on any machine.
//
//   * Each stage becomes one or more instructions whose params are the op's device-ready plan: the
//     GEMVs the very plan their launcher makes for the device's SM count (the plan fixes every sum's
//     order, so both paths give the same bits), the expert streams planned for the megakernel's grid
//     (how entries are grouped into passes changes no bits), the router as its GEMV and its top-k,
//     the expert stage as gate/up and down (up to 8 tokens the stream blocks build the work list
//     and quantise the input themselves, as the graph path does) or, above, as its input
//     quantiser, its work list, gate/up and down.
//   * Dependencies are derived, not declared: each instruction lists the byte ranges it reads and
//     writes (and which of them its prologue touches); an instruction depends on every earlier one
//     whose accesses conflict with its own (read after write, write after read, write after write),
//     so buffers reused across layers stay safe. Dependencies implied by others are dropped.
//     Deliberate exceptions, as in the graph path: split-KV's prologue copies settled cache pages
//     (every page but the one kv_append writes) before its wait, and the error flags' sticky OR
//     updates are not ordered (a flagged step's outputs are void).
//   * Tensor maps are requested, not encoded: the caller encodes them into the table whose device
//     address it passed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <cuda.h>

#include <encore/pipeline/stage_list.h>
#include <encore/status.h>

#include "pipeline/megakernel/program.cuh"

namespace encore::pipeline::megakernel {

struct Target {
  int sms = 0;                     // SMs the megakernel runs on
  std::size_t smem_per_block = 0;  // opt-in dynamic shared memory per block
  int blocks_per_sm = 1;           // resident blocks per SM: the grid is sms * blocks_per_sm
  int plan_sms = 0;                // the device's SM count, for the GEMV plans (the graph path's sums); 0: sms
};

// Maps an instruction needs, encoded by the caller into table slots [slot, slot + count).
struct MapRequest {
  int slot = 0, count = 0;
  std::function<Status(CUtensorMap* first)> encode;
};

// A byte range an instruction reads or writes, and whether its prologue (before its wait) does.
struct Access {
  std::uintptr_t begin = 0, end = 0;
  bool write = false;
  bool early = false;
};

struct InstructionInfo {
  std::string name;   // e.g. "blk.3.moe.gate_up"
  int stage = -1;     // index in the stage table
  int layer = -1;
  std::size_t smem = 0;
  std::vector<Access> accesses;  // what the dependencies were derived from
};

struct Program {
  std::vector<Instruction> instructions;
  std::vector<InstructionInfo> info;
  std::vector<MapRequest> maps;
  int map_slots = 0;
  int grid = 0;          // blocks: Target::sms * Target::blocks_per_sm
  int tokens = 1;        // the GEMV token tier the kernel is instantiated for
  std::size_t smem = 0;  // dynamic shared memory: the program's slots and schedule + the most any body needs
  // Per block, the instructions it has a tile of: [grid][count + 1], row = {length, indices...}.
  std::vector<std::uint16_t> schedule;
  // Per schedule entry (the same places; 0 for the lengths): bit 0, the block has already waited,
  // in this step, for every early producer of the instruction or for one that implies it; bit 1,
  // the same for the late producers (the down stream waits again for the top-k its block's gate/up
  // waited for). The kernel skips those waits.
  std::vector<std::uint8_t> waited;
};

// Slots the map table needs at most for `stages`.
int map_slots_bound(const std::vector<Stage>& stages);

Status lower(const std::vector<Stage>& stages, const Target& target, const CUtensorMap* map_table, Program* out);

}  // namespace encore::pipeline::megakernel
