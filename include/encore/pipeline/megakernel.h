// The megakernel path (docs/megakernel.md): a whole decode step of a Pipeline in one cooperative
// persistent launch. The stage table is lowered once into a device-resident program of
// instructions (the same op bodies the graph path's kernels run, planned for the resident blocks);
// every block walks it in order and meets its producers on per-instruction counters in global
// memory instead of kernel boundaries. Its results are bit-identical to the graph path's.
//
//   Megakernel mk;
//   ENCORE_RETURN_IF_ERROR(Megakernel::build(pipeline, mk));       // once per Pipeline::set_batch
//   for each token: pipeline.set_step(inputs); mk.run(stream); ...  // input copy + one launch
//
// The launch can itself be captured into a CUDA graph. The pipeline must outlive the megakernel,
// and a set_batch after build needs a new build.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include <encore/pipeline/decode_step.h>
#include <encore/pipeline/pipeline.h>
#include <encore/status.h>

namespace encore::pipeline {

struct MegakernelOptions {
  // true: run() starts with the copy of Pipeline::set_step's pinned staging buffer. false: run()
  // is the launch alone, for callers that write the step inputs into device memory themselves.
  bool copy_staged_inputs = true;
  // Every wait on a producer is bounded: one that lasts longer records which wait it was
  // (instruction, tile, producer, counts) and ends the launch early; read_status() reports it as
  // an error. A correct program never waits long; 0 waits forever.
  std::uint32_t wait_timeout_ms = 2000;
  // Test mode: every launch maps tiles to blocks by a fresh permutation and delays each block's
  // completion signals by a random few microseconds. The results must not change.
  bool stress = false;
  std::uint32_t stress_seed = 1;
  // Test hook: the first producer of this instruction is waited for with a count it never
  // reaches (the timeout then reports it). -1: none.
  int break_dependency_of = -1;
  // Profiling: every launch records, per instruction and block, when the block reached it, when
  // its producers released it and when it signalled (read with trace()), and at one block per SM
  // the bodies' marks. It runs a kernel compiled with the marks (the normal one carries none of
  // their code): costs a little time.
  bool trace = false;
  // Resident 256-thread blocks per SM: 1, or 2 (twice the warps to hide latency; every body then
  // gets at most half the SM's shared memory and 128 registers per thread). build() refuses 2
  // with kUnsupported, naming the instruction, when a body needs more shared memory (Kimi-Linear
  // from batch 3: the dense down projection). The results are the same bits.
  int blocks_per_sm = 1;
  // Probe: every body is skipped, so a launch is the program's waits and signals alone, the
  // dependency chain's own time. Its outputs are void; states and caches are left untouched.
  bool chain_only = false;
  // Plan and launch for this many SMs (blocks_per_sm blocks each) instead of the device's: 0 (or
  // more than the device has) means all of them; negative is refused by build(). Fewer blocks give every instruction more tiles per block (tests use it to run
  // the multi-round paths on tiny models); the results are the same bits.
  int sms = 0;
};

// One instruction of the program, for inspection (tests, traces).
struct MegakernelInstruction {
  std::string name;      // e.g. "blk.4.moe.gate_up"
  int stage = -1;        // the stage it came from
  int tiles = 0;
  std::size_t smem = 0;  // the dynamic shared memory its body needs
  std::vector<int> prologue_producers, producers;  // instruction indices
  int first_block = 0;   // the block of its lane 0: lane l runs on block (first_block + l) mod grid (not in stress mode)
  int lanes = 0;         // blocks that run it: lane l < lanes takes tiles l, l + lanes, ...
};

// What a body marked on one block (thread 0) inside an instruction: expert stream items, GEMV,
// KDA and split-KV tiles (docs/megakernel.md §3, "Trace"). KDA and split-KV mark their begin and
// set-up before their wait.
enum class MegakernelMark {
  kStreamReady,  // the set-up is done (work list, activations, first weights or pages issued)
  kItemBegin,    // item `item` (the block's k-th; KDA, split-KV: the tile) starts
  kItemWeights,  // warp 0 has the item's first weights; value: the item's expert (expert streams)
  kItemComputed, // warp 0 is done with the item's weights (before the epilogue and block barrier)
  kItemEnd,      // the block is done with the item; value: ns warp 0 waited for its weights
  kCombine,      // the down stream's ordered combine starts; value: row chunks it combines
  kListBuilt,    // an expert stream's work list and item table are in shared memory
  kRingStarted,  // an expert stream's first weights are issued
};
inline constexpr int kMegakernelMarkKinds = int(MegakernelMark::kRingStarted) + 1;  // (the last one above)
struct MegakernelMarkTime {
  MegakernelMark mark = MegakernelMark::kItemBegin;
  int item = -1;
  double us = 0;             // from the launch's first block start, as the block times
  std::uint32_t value = 0;
};
struct MegakernelBlockTime {
  int block = 0;
  double start = 0, ready = 0, end = 0;  // reached the instruction, passed its wait, signalled
  std::vector<MegakernelMarkTime> marks;  // in the order made
};
// Where one instruction's time went in the last traced launch (us from the launch's first block
// start): the earliest arrival, the first and last release by its producers, the last signal.
struct MegakernelInstructionTime {
  double start = 0, first_ready = 0, last_ready = 0, end = 0;
  int blocks = 0;                            // blocks that ran a tile of it
  std::vector<MegakernelBlockTime> per_block;  // those blocks' own times
};

class Megakernel final : public DecodeStep {
 public:
  Megakernel() = default;

  // Lowers pipeline.stages() (its current batch), encodes the tensor maps, uploads the program and
  // checks that options.blocks_per_sm blocks per SM are co-resident with the shared memory the
  // program needs. On error nothing is kept.
  static Status build(Pipeline& pipeline, Megakernel& out, const MegakernelOptions& options = {});

  bool valid() const { return device_ != nullptr; }
  // The staged inputs' copy (options.copy_staged_inputs) + the launch; kOutOfRange, with nothing
  // launched, when the staged step has more rows than the batch the program was built for.
  Status run(cudaStream_t stream) const override;
  const char* path() const override { return "megakernel"; }
  bool copies_staged_inputs() const override { return copies_inputs_; }
  // The launch alone (the caller wrote the step inputs into the pipeline's buffers itself).
  Status launch(cudaStream_t stream) const;
  // Synchronises `stream`; a wait that timed out is reported (then the dependency counters are
  // reset so the next launch starts clean; the state of the abandoned step is undefined: reset it
  // with Pipeline::reset_state before the next step).
  Status read_status(cudaStream_t stream);

  // The last launch's timeline (options.trace): one entry per instruction, with the marks its
  // bodies made per block. Synchronises `stream`. kOutOfRange, with `out` filled, when a block made
  // more marks than it keeps (the first ones are listed).
  Status trace(cudaStream_t stream, std::vector<MegakernelInstructionTime>& out) const;

  int batch() const override { return batch_; }
  int grid() const { return grid_; }
  std::size_t smem_bytes() const { return smem_; }
  int token_tier() const { return tokens_; }
  const std::vector<MegakernelInstruction>& program() const { return program_; }

 private:
  struct DeviceFree {
    void operator()(void* p) const;
  };
  Pipeline* pipeline_ = nullptr;
  // program | schedule | map table | counters | wait reports | trace | marks, one allocation
  std::unique_ptr<void, DeviceFree> device_;
  const void* kernel_ = nullptr;
  int grid_ = 0, tokens_ = 1, count_ = 0, batch_ = 0;
  std::size_t smem_ = 0;
  std::size_t counters_offset_ = 0, counters_bytes_ = 0, report_offset_ = 0, trace_offset_ = 0, schedule_offset_ = 0;
  std::size_t marks_offset_ = 0, mark_counts_offset_ = 0;
  std::uint64_t timeout_ns_ = 0;
  std::uint32_t stress_seed_ = 0;
  bool chain_only_ = false;
  bool copies_inputs_ = true;
  std::vector<MegakernelInstruction> program_;
};

}  // namespace encore::pipeline
