// Host side of the megakernel path: lowering, the device program, the launch, the wait report.
#include <encore/pipeline/megakernel.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "common/body.cuh"
#include "common/cuda_check.h"
#include "common/block.h"
#include "common/launch.h"
#include "pipeline/megakernel/kernel.h"
#include "pipeline/megakernel/lower.h"
#include "pipeline/megakernel/program.cuh"

namespace encore::pipeline {
namespace {

using megakernel::Instruction;
using megakernel::KernelArgs;
using megakernel::WaitReport;

// The public marks are the bodies' (common/body.cuh), value for value.
static_assert(int(MegakernelMark::kStreamReady) == int(device::Mark::kStreamReady) &&
              int(MegakernelMark::kItemBegin) == int(device::Mark::kItemBegin) &&
              int(MegakernelMark::kItemWeights) == int(device::Mark::kItemWeights) &&
              int(MegakernelMark::kItemComputed) == int(device::Mark::kItemComputed) &&
              int(MegakernelMark::kItemEnd) == int(device::Mark::kItemEnd) &&
              int(MegakernelMark::kCombine) == int(device::Mark::kCombine) &&
              int(MegakernelMark::kListBuilt) == int(device::Mark::kListBuilt) &&
              int(MegakernelMark::kRingStarted) == int(device::Mark::kRingStarted));

std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

// The megakernel's one device allocation: program | schedule | map table | step counters, one
// counter per instruction | wait reports | (trace mode) trace | marks | mark counts.
struct DeviceLayout {
  std::size_t schedule = 0, maps = 0, counters = 0, counters_bytes = 0, report = 0, trace = 0, marks = 0, mark_counts = 0, total = 0;
  DeviceLayout(int instructions, int map_slots, int grid, bool traced) {
    schedule = round_up(std::size_t(instructions) * sizeof(Instruction), 128);
    maps = round_up(schedule + std::size_t(grid) * (instructions + 1) * sizeof(std::uint16_t), 128);
    counters = round_up(maps + std::size_t(map_slots) * sizeof(CUtensorMap), 128);
    counters_bytes = (std::size_t(instructions) + 1) * megakernel::kCounterStride * sizeof(std::uint32_t);  // step line, then one per instruction
    report = round_up(counters + counters_bytes, 128);
    trace = round_up(report + std::size_t(grid) * sizeof(WaitReport), 128);
    if (!traced) {
      total = trace;
      return;
    }
    marks = round_up(trace + std::size_t(instructions) * grid * sizeof(megakernel::TraceEntry), 128);
    mark_counts = marks + std::size_t(grid) * megakernel::kMarksPerBlock * sizeof(megakernel::MarkEntry);
    total = mark_counts + std::size_t(grid) * sizeof(std::uint32_t);
  }
};

}  // namespace

// (A destructor cannot report; an error here means a broken context.)
void Megakernel::DeviceFree::operator()(void* p) const { cudaFree(p); }

Status Megakernel::build(Pipeline& pipeline, Megakernel& out, const MegakernelOptions& options) {
  out = Megakernel();
  const std::vector<Stage>& stages = pipeline.stages();
  ENCORE_REQUIRE(!stages.empty(), StatusCode::kInvalidArgument, "Megakernel::build: the pipeline has no stages");
  int ordinal = 0, cooperative = 0;
  ENCORE_CUDA_TRY(cudaGetDevice(&ordinal));
  ENCORE_CUDA_TRY(cudaDeviceGetAttribute(&cooperative, cudaDevAttrCooperativeLaunch, ordinal));
  ENCORE_REQUIRE(cooperative, StatusCode::kUnsupported, "Megakernel::build: the device does not support cooperative launches");
  ENCORE_REQUIRE(options.blocks_per_sm == 1 || options.blocks_per_sm == 2, StatusCode::kInvalidArgument,
                 "Megakernel::build: blocks_per_sm must be 1 or 2 (got ", options.blocks_per_sm, ")");
  ENCORE_REQUIRE(options.sms >= 0, StatusCode::kInvalidArgument, "Megakernel::build: sms must be 0 (all) or positive (got ",
                 options.sms, ")");
  const int sms = options.sms > 0 ? std::min(options.sms, detail::sm_count()) : detail::sm_count();
  const megakernel::Target target{sms, std::size_t(detail::max_shared_memory_per_block(options.blocks_per_sm)),
                                  options.blocks_per_sm, detail::sm_count()};

  // Lowered twice: first to size the device allocation, then with the map table's real address.
  megakernel::Program program;
  ENCORE_RETURN_IF_ERROR(megakernel::lower(stages, target, nullptr, &program));
  const DeviceLayout layout(int(program.instructions.size()), megakernel::map_slots_bound(stages), program.grid, options.trace);
  void* device = nullptr;
  ENCORE_CUDA_TRY(cudaMalloc(&device, layout.total));
  Megakernel mk;
  mk.device_.reset(device);  // owned from here: freed on any error below
  const auto* map_table = reinterpret_cast<const CUtensorMap*>(static_cast<char*>(device) + layout.maps);
  ENCORE_RETURN_IF_ERROR(megakernel::lower(stages, target, map_table, &program));
  const int count = int(program.instructions.size());
  if (options.break_dependency_of >= 0) {
    ENCORE_REQUIRE(options.break_dependency_of < count, StatusCode::kOutOfRange, "Megakernel::build: break_dependency_of = ",
                   options.break_dependency_of, " is past the ", count, " instructions");
    Instruction& ins = program.instructions[options.break_dependency_of];
    ENCORE_REQUIRE(ins.h.early_deps + ins.h.late_deps > 0, StatusCode::kInvalidArgument, "Megakernel::build: instruction ",
                   options.break_dependency_of, " has no producer to break");
    ins.deps[0].need = ins.deps[0].per_step + 1;  // one tile more than the producer has
    // (no block may take the broken producer as waited for)
    for (std::size_t e = 0; e < program.schedule.size(); ++e)
      if (program.waited[e] && program.schedule[e] == options.break_dependency_of) program.waited[e] = 0;
  }
  // The device schedule: each entry's index with its waited flags.
  std::vector<std::uint16_t> schedule = program.schedule;
  for (std::size_t e = 0; e < schedule.size(); ++e)
    schedule[e] |= std::uint16_t((program.waited[e] & 1 ? megakernel::kEarlyWaited : 0) |
                                 (program.waited[e] & 2 ? megakernel::kLateWaited : 0));

  std::vector<CUtensorMap> maps(std::size_t(program.map_slots));
  for (const megakernel::MapRequest& r : program.maps) ENCORE_RETURN_IF_ERROR(r.encode(maps.data() + r.slot));
  char* base = static_cast<char*>(device);
  ENCORE_CUDA_TRY(cudaMemcpy(base, program.instructions.data(), std::size_t(count) * sizeof(Instruction),
                             cudaMemcpyHostToDevice));
  ENCORE_CUDA_TRY(cudaMemcpy(base + layout.schedule, schedule.data(), schedule.size() * sizeof(std::uint16_t),
                             cudaMemcpyHostToDevice));
  if (!maps.empty())
    ENCORE_CUDA_TRY(cudaMemcpy(base + layout.maps, maps.data(), maps.size() * sizeof(CUtensorMap), cudaMemcpyHostToDevice));
  ENCORE_CUDA_TRY(cudaMemset(base + layout.counters, 0, layout.total - layout.counters));
  // The copies and the memset ran on the legacy stream: done before a launch on any stream.
  ENCORE_CUDA_TRY(cudaDeviceSynchronize());

  // blocks_per_sm blocks per SM must be co-resident with the program's shared memory.
  const void* kernel = megakernel::kernel_for(program.tokens, options.blocks_per_sm, options.trace);
  ENCORE_REQUIRE(kernel, StatusCode::kInvalidArgument, "Megakernel::build: no kernel for token tier ", program.tokens);
  // The attribute is the function's, shared by every Megakernel of this tier: only ever raised, so
  // building a smaller program never breaks an earlier one's launch.
  cudaFuncAttributes attributes{};
  ENCORE_CUDA_TRY(cudaFuncGetAttributes(&attributes, kernel));
  if (std::size_t(attributes.maxDynamicSharedSizeBytes) < program.smem)
    ENCORE_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(program.smem)));
  int per_sm = 0;
  ENCORE_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kBlockThreads, program.smem));
  ENCORE_REQUIRE(per_sm >= options.blocks_per_sm, StatusCode::kUnsupported, "Megakernel::build: ", options.blocks_per_sm,
                 " block(s) of ", kBlockThreads, " threads with ", program.smem, " bytes of shared memory do not fit on an SM (",
                 per_sm, " do: registers or shared memory)");

  mk.pipeline_ = &pipeline;
  mk.batch_ = pipeline.batch();
  mk.kernel_ = kernel;
  mk.grid_ = program.grid, mk.tokens_ = program.tokens, mk.count_ = count, mk.smem_ = program.smem;
  mk.counters_offset_ = layout.counters, mk.counters_bytes_ = layout.trace - layout.counters, mk.report_offset_ = layout.report;
  mk.trace_offset_ = options.trace ? layout.trace : 0;
  mk.marks_offset_ = layout.marks, mk.mark_counts_offset_ = layout.mark_counts;
  mk.schedule_offset_ = layout.schedule;
  mk.timeout_ns_ = std::uint64_t(options.wait_timeout_ms) * 1000000ull;
  mk.stress_seed_ = options.stress ? (options.stress_seed ? options.stress_seed : 1u) : 0u;
  mk.copies_inputs_ = options.copy_staged_inputs;
  mk.chain_only_ = options.chain_only;
  for (int i = 0; i < count; ++i) {
    const Instruction& ins = program.instructions[i];
    MegakernelInstruction info{program.info[i].name, program.info[i].stage, ins.h.tiles, program.info[i].smem, {}, {},
                               (program.grid - ins.h.lane_offset) % program.grid, ins.h.lanes};
    for (int d = 0; d < ins.h.early_deps + ins.h.late_deps; ++d)
      (d < ins.h.early_deps ? info.prologue_producers : info.producers).push_back(ins.deps[d].instruction);
    mk.program_.push_back(std::move(info));
  }
  out = std::move(mk);
  return {};
}

Status Megakernel::launch(cudaStream_t stream) const {
  ENCORE_REQUIRE(device_, StatusCode::kInvalidArgument, "Megakernel::launch: nothing built");
  ENCORE_RETURN_IF_ERROR(detail::check_stream(stream));
  char* base = static_cast<char*>(device_.get());
  KernelArgs args{};
  args.program = reinterpret_cast<const Instruction*>(base);  // (the program opens the allocation)
  args.count = count_;
  args.schedule = reinterpret_cast<const std::uint16_t*>(base + schedule_offset_);
  args.step = reinterpret_cast<std::uint32_t*>(base + counters_offset_);
  args.done = args.step + megakernel::kCounterStride;
  args.report = reinterpret_cast<WaitReport*>(base + report_offset_);
  args.wait_timeout_ns = timeout_ns_;
  args.stress_seed = stress_seed_;
  args.skip_bodies = chain_only_;
  args.trace = trace_offset_ ? reinterpret_cast<megakernel::TraceEntry*>(base + trace_offset_) : nullptr;
  if (args.trace) {  // blocks without a tile of an instruction leave its entry zero
    ENCORE_CUDA_TRY(cudaMemsetAsync(args.trace, 0, std::size_t(count_) * grid_ * sizeof(megakernel::TraceEntry), stream));
    args.marks = reinterpret_cast<megakernel::MarkEntry*>(base + marks_offset_);
    args.mark_counts = reinterpret_cast<std::uint32_t*>(base + mark_counts_offset_);
    // (a block that leaves early, on a timed-out wait, writes no count)
    ENCORE_CUDA_TRY(cudaMemsetAsync(args.mark_counts, 0, std::size_t(grid_) * sizeof(std::uint32_t), stream));
  }
  void* params[] = {&args};
  ENCORE_CUDA_TRY(cudaLaunchCooperativeKernel(kernel_, dim3(grid_), dim3(kBlockThreads), params, smem_, stream));
  return detail::check_launch("megakernel");
}

Status Megakernel::run(cudaStream_t stream) const {
  ENCORE_REQUIRE(device_ && pipeline_, StatusCode::kInvalidArgument, "Megakernel::run: nothing built");
  if (!copies_inputs_) return launch(stream);
  ENCORE_REQUIRE(pipeline_->staged_rows() <= batch_, StatusCode::kOutOfRange, "Megakernel::run: the staged step has ",
                 pipeline_->staged_rows(), " rows; the program was built for batch ", batch_, " (build again after set_batch)");
  ENCORE_RETURN_IF_ERROR(pipeline_->enqueue_inputs(stream));
  return launch(stream);
}

Status Megakernel::read_status(cudaStream_t stream) {
  ENCORE_REQUIRE(device_, StatusCode::kInvalidArgument, "Megakernel::read_status: nothing built");
  ENCORE_CUDA_TRY(cudaStreamSynchronize(stream));
  std::vector<WaitReport> reports(static_cast<std::size_t>(grid_));
  ENCORE_CUDA_TRY(cudaMemcpy(reports.data(), static_cast<char*>(device_.get()) + report_offset_, reports.size() * sizeof(WaitReport),
                             cudaMemcpyDeviceToHost));
  // The earliest instruction that timed out: every later waiter waits, directly or not, on it.
  const WaitReport* r = nullptr;
  for (const WaitReport& w : reports)
    if (w.aborted && (!r || w.instruction < r->instruction)) r = &w;
  if (!r) return {};
  const WaitReport first = *r;
  // On `stream`, so the next launch there finds them zero.
  ENCORE_CUDA_TRY(cudaMemsetAsync(static_cast<char*>(device_.get()) + counters_offset_, 0, counters_bytes_, stream));
  auto name = [&](int i) { return i >= 0 && i < count_ ? program_[i].name : std::string("?"); };
  return Status(StatusCode::kCudaError,
                detail::concat("megakernel: a wait timed out in step ", first.step, ": instruction ", first.instruction, " (",
                               name(first.instruction), ") on lane ", first.lane, " waited for instruction ", first.producer, " (",
                               name(first.producer), ") to reach ", first.target, " tiles and saw ", first.seen,
                               "; the launch ended early, the step's results are void"));
}

Status Megakernel::trace(cudaStream_t stream, std::vector<MegakernelInstructionTime>& out) const {
  ENCORE_REQUIRE(device_ && trace_offset_, StatusCode::kInvalidArgument, "Megakernel::trace: not built with options.trace");
  ENCORE_CUDA_TRY(cudaStreamSynchronize(stream));
  std::vector<megakernel::TraceEntry> t(std::size_t(count_) * grid_);
  ENCORE_CUDA_TRY(cudaMemcpy(t.data(), static_cast<char*>(device_.get()) + trace_offset_, t.size() * sizeof(t[0]), cudaMemcpyDeviceToHost));
  std::vector<std::uint32_t> counts(std::size_t(grid_), 0);
  ENCORE_CUDA_TRY(cudaMemcpy(counts.data(), static_cast<char*>(device_.get()) + mark_counts_offset_, counts.size() * sizeof(counts[0]),
                             cudaMemcpyDeviceToHost));
  std::vector<megakernel::MarkEntry> marks(std::size_t(grid_) * megakernel::kMarksPerBlock);
  ENCORE_CUDA_TRY(cudaMemcpy(marks.data(), static_cast<char*>(device_.get()) + marks_offset_, marks.size() * sizeof(marks[0]),
                             cudaMemcpyDeviceToHost));
  std::uint64_t origin = ~0ull;
  for (const auto& e : t)
    if (e.start) origin = std::min(origin, e.start);
  auto us = [&](std::uint64_t ns) { return (double(ns) - double(origin)) * 1e-3; };
  std::vector<int> entry(t.size(), -1);  // (instruction, block) -> its index in out[instruction].per_block
  out.assign(std::size_t(count_), MegakernelInstructionTime{});
  for (int i = 0; i < count_; ++i) {
    MegakernelInstructionTime& m = out[i];
    std::uint64_t start = ~0ull, first = ~0ull, last = 0, end = 0;
    for (int b = 0; b < grid_; ++b) {
      const megakernel::TraceEntry& e = t[std::size_t(i) * grid_ + b];
      if (!e.start) continue;
      ++m.blocks;
      start = std::min(start, e.start), first = std::min(first, e.ready), last = std::max(last, e.ready), end = std::max(end, e.end);
    }
    if (!m.blocks) continue;
    m.start = us(start), m.first_ready = us(first), m.last_ready = us(last), m.end = us(end);
    for (int b = 0; b < grid_; ++b) {
      const megakernel::TraceEntry& e = t[std::size_t(i) * grid_ + b];
      if (!e.start) continue;
      entry[std::size_t(i) * grid_ + b] = int(m.per_block.size());
      m.per_block.push_back({b, us(e.start), us(e.ready), us(e.end), {}});
    }
  }
  // The bodies' marks, to the (instruction, block) entries they were made in.
  std::uint64_t dropped = 0;
  for (int b = 0; b < grid_; ++b) {
    const std::uint32_t n = std::min<std::uint32_t>(counts[b], megakernel::kMarksPerBlock);
    for (std::uint32_t j = 0; j < n; ++j) {
      const megakernel::MarkEntry& e = marks[std::size_t(b) * megakernel::kMarksPerBlock + j];
      const int at = e.instruction >= 0 && e.instruction < count_ ? entry[std::size_t(e.instruction) * grid_ + b] : -1;
      ENCORE_REQUIRE(at >= 0 && e.mark < std::uint32_t(kMegakernelMarkKinds), StatusCode::kCudaError, "Megakernel::trace: block ",
                     b, "'s mark ", j, " (kind ", e.mark, ") names instruction ", e.instruction, ", which the block did not run");
      out[e.instruction].per_block[at].marks.push_back({MegakernelMark(e.mark), e.item, us(e.ns), e.value});
    }
    dropped += counts[b] - n;
  }
  ENCORE_REQUIRE(dropped == 0, StatusCode::kOutOfRange, "Megakernel::trace: ", dropped, " marks did not fit the ",
                 megakernel::kMarksPerBlock, " a block keeps (the times are complete; the marks list only the first)");
  return {};
}

}  // namespace encore::pipeline
