// Integer counters in global memory that the blocks of one grid meet on: the megakernel's tile
// counters, the MoE combine's chunk counters and the router's arrival counter, the MLA fused
// combine's. A block's threads write, the block synchronises, one thread adds with release
// semantics; a reader's thread loads (or adds) with acquire semantics, then its block
// synchronises. The barriers and the release's cumulativity carry the ordering, so no fence is
// needed: a fence would first wait for the thread's own memory operations in flight, and
// __threadfence() is a sequentially consistent one.
#pragma once

#include <cstdint>
#include <type_traits>

namespace encore::device {

template <class T>
concept CounterWord = std::is_same_v<T, int> || std::is_same_v<T, std::uint32_t>;

template <CounterWord T>
__device__ __forceinline__ T load_relaxed_gpu(const T* p) {
  T v;
  asm volatile("ld.relaxed.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

template <CounterWord T>
__device__ __forceinline__ T load_acquire_gpu(const T* p) {
  T v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

template <CounterWord T>
__device__ __forceinline__ void add_release_gpu(T* p, T v) {
  if constexpr (std::is_same_v<T, int>)
    asm volatile("red.release.gpu.global.add.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
  else
    asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// Both ways in one atomic: the adder's block's writes go out with its count, and the adder that
// sees the final count has every earlier one's. Returns the count before the add (a two's-complement
// add, so .u32 serves both types).
template <CounterWord T>
__device__ __forceinline__ T add_acq_rel_gpu(T* p, T v) {
  T old;
  asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}

// One thread: spins until *p >= count (acquire); a barrier of its block then hands what it saw
// to the others.
__device__ __forceinline__ void wait_count_acquire(const int* p, int count) {
  while (load_acquire_gpu(p) < count) __nanosleep(32);
}

}  // namespace encore::device
