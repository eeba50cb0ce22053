// The contract every device body of the decode step follows, so that one body serves both paths:
// its standalone kernel (the graph path) and the megakernel (pipeline/megakernel/).
//
//   * Tiles: a body runs tiles first, first + stride, ... of its op (a TileRange or GridRange) and
//     never reads blockIdx / gridDim itself. A standalone kernel passes its grid; the megakernel the
//     block's lane of the instruction and the grid size.
//   * Phases: a prologue that touches only weights and data settled before the step (weight copies
//     into shared memory, L2 prefetches, state loads), then wait(), then the work. wait() is the
//     caller's policy: griddepcontrol.wait in a standalone kernel (PdlWait), an acquire on the
//     producers' counters in the megakernel. Every thread calls it at the same point; calls after
//     the first return at once, so a body that runs several tiles may call it per tile.
//   * Shared memory: carved from the one dynamic buffer the caller passes (1024-byte aligned in the
//     megakernel); no static __shared__. What a body leaves there for the block's next body is
//     announced and checked through the policy (leave_handoff / handoff_from_previous below).
//   * Coherence: data written earlier in the same launch is read with coherent loads (plain or
//     ld.global.cg), never __ldg / ld.global.nc; weights and step inputs may use the read-only path.
//   * On return: no asynchronous copy is in flight, and when another body follows in the same block
//     (Wait::kSharedMemoryReused, the megakernel) every mbarrier the body initialised has been
//     invalidated, so the next body may reuse the bytes (the megakernel also fences the async proxy
//     and synchronises the block between bodies). A standalone kernel exits instead.
#pragma once

#include <cstdint>

#include "common/async_copy.cuh"
#include "common/pdl.cuh"

namespace encore::device {

// Bodies take either range type (a template parameter): the megakernel's values, or a standalone
// kernel's grid, read from the special registers where used (no registers held across a body).
struct TileRange {
  static constexpr bool kOneTile = false;
  int first_tile, tile_stride;
  __device__ __forceinline__ int first() const { return first_tile; }
  __device__ __forceinline__ int stride() const { return tile_stride; }
};
// A standalone kernel's range: block b of a grid of G blocks runs tiles b, b + G, ...
struct GridRange {
  static constexpr bool kOneTile = false;
  __device__ __forceinline__ int first() const { return int(blockIdx.x); }
  __device__ __forceinline__ int stride() const { return int(gridDim.x); }
};
// A standalone kernel launched with one block per tile: block b runs tile b alone.
struct BlockTile {
  static constexpr bool kOneTile = true;
  __device__ __forceinline__ int first() const { return int(blockIdx.x); }
  __device__ __forceinline__ int stride() const { return int(gridDim.x); }
};

// The standalone kernels' wait: griddepcontrol.wait, then (release = true) let the next kernel in
// the stream launch, as the kernels that start their dependents right after their own wait do.
struct PdlWait {
  static constexpr bool kSharedMemoryReused = false;
  // Whether a body's prologue may run after its producers are done, on the critical path (the
  // megakernel: a block reaches an instruction when it gets there), so that what it issues before
  // its first work should be short. A standalone kernel's prologue runs under the previous
  // kernel's tail.
  static constexpr bool kPrologueExposed = false;
  // Whether the body's warps run alone on their SM (the megakernel's block), so that their own
  // loads in flight, not other blocks' warps, must hide its loops' latency.
  static constexpr bool kLatencyExposed = false;
  bool release = true;
  __device__ __forceinline__ void operator()() const {
    wait_for_upstream();
    if (release) allow_downstream();
  }
};

// Marks a body leaves in a traced megakernel launch (Megakernel::trace, per block): where its items
// (expert stream items, GEMV tiles) began, first had weights and ended. Only a wait policy that
// records them has mark() / marking(); with the others (the standalone kernels) these calls compile
// to nothing. Thread 0 records; the other threads' calls are no-ops.
enum class Mark : std::uint32_t {
  kStreamReady,  // the body's set-up is done (work list, activations, first weights issued)
  kItemBegin,    // item `item` starts
  kItemWeights,  // warp 0 has the item's first weights (value: the item's expert)
  kItemComputed, // warp 0 is done with the item's weights (before the epilogue and block barrier)
  kItemEnd,      // the block is done with the item (value: ns warp 0 waited for its weights)
  kCombine,      // the down stream's ordered combine starts (value: row chunks it combines)
  kListBuilt,    // an expert stream's work list and item table are in shared memory
  kRingStarted,  // an expert stream's first weights are issued
};

// Whether a wait policy records marks at all (the megakernel's, in every launch; it marks only in
// trace mode).
template <class Wait>
concept Marks = requires(Wait& wait, Mark m) {
  wait.marking();
  wait.mark(m, 0, 0u);
};

template <class Wait>
__device__ __forceinline__ bool marking(const Wait& wait) {
  if constexpr (Marks<Wait>)
    return wait.marking();
  else
    return false;
}

template <class Wait>
__device__ __forceinline__ void mark(Wait& wait, Mark m, int item, std::uint32_t value = 0) {
  if constexpr (Marks<Wait>) wait.mark(m, item, value);
}

// Shared memory handed to the next instruction: a body that leaves something in its shared memory
// for the body of the block's next instruction (the MoE gate/up leaves its work list for down) says
// so with leave_handoff(); the next body asks handoff_from_previous(), true only when the block's
// previous instruction in this launch was the one that left it. Only the megakernel's policy keeps
// shared memory from one body to the next; with the others (standalone kernels) these are a no-op
// and false.
template <class Wait>
concept HandsOff = requires(Wait& wait) {
  wait.leave_handoff();
  wait.handoff_from_previous();
};

template <class Wait>
__device__ __forceinline__ void leave_handoff(Wait& wait) {
  if constexpr (HandsOff<Wait>) wait.leave_handoff();
}

template <class Wait>
__device__ __forceinline__ bool handoff_from_previous(const Wait& wait) {
  if constexpr (HandsOff<Wait>)
    return wait.handoff_from_previous();
  else
    return false;
}

__device__ __forceinline__ std::uint64_t global_ns() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Invalidates `count` mbarriers (one thread; every phase complete, no copy in flight).
__device__ __forceinline__ void barrier_inval(std::uint64_t* bars, int count) {
  for (int i = 0; i < count; ++i)
    asm volatile("mbarrier.inval.shared::cta.b64 [%0];" ::"r"(smem_address(bars + i)) : "memory");
}

}  // namespace encore::device
