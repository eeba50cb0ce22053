// Asynchronous global -> shared copies, one set of primitives for every op: 16-byte cp.async
// (completion by commit groups), and bulk copies (the TMA engine's cp.async.bulk, flat or tiled
// through a tensor map) completing on an mbarrier, whose bytes in flight cost no registers (the
// Q4_K GEMV, the MoE expert streams, MLA's latent pages). sm_90.
#pragma once

#include <cstdint>

#include <cuda.h>

namespace encore::device {

// Orders this thread's earlier generic-proxy accesses of shared memory before its later
// async-proxy ones (bulk copies into memory that was just read or written by threads).
__device__ __forceinline__ void fence_proxy_async() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}

__device__ __forceinline__ std::uint32_t smem_address(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte copy; src_bytes < 16 reads that many bytes and zero-fills the rest (0: zeros only).
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, int src_bytes = 16) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_address(dst)), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// Waits until at most `Pending` of the thread's committed groups are still in flight.
template <int Pending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(Pending) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }

__device__ __forceinline__ void barrier_init(std::uint64_t* bar, std::uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_address(bar)), "r"(arrivals) : "memory");
}

// Makes initialised barriers visible to the async proxy (the bulk copies' completion).
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// One arrival that also announces `bytes` of bulk-copy data still to land in this phase.
__device__ __forceinline__ void barrier_arrive_expect(std::uint64_t* bar, std::uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_address(bar)), "r"(bytes) : "memory");
}

// Waits until the phase with parity `parity` has completed (all bytes landed).
__device__ __forceinline__ void barrier_wait(std::uint64_t* bar, std::uint32_t parity) {
  const std::uint32_t addr = smem_address(bar);
  std::uint32_t done = 0;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
        : "=r"(done)
        : "r"(addr), "r"(parity)
        : "memory");
  } while (!done);
}

// Global -> shared bulk copy of `bytes` (a multiple of 16, both addresses 16-byte aligned).
__device__ __forceinline__ void bulk_copy_to_shared(void* dst, const void* src, std::uint32_t bytes, std::uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   smem_address(dst)),
               "l"(src), "r"(bytes), "r"(smem_address(bar))
               : "memory");
}
// The same with an L2 cache policy (createpolicy), e.g. evict-first for weights read once per step.
__device__ __forceinline__ void bulk_copy_to_shared(void* dst, const void* src, std::uint32_t bytes, std::uint64_t* bar,
                                                    std::uint64_t policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::"r"(
          smem_address(dst)),
      "l"(src), "r"(bytes), "r"(smem_address(bar)), "l"(policy)
      : "memory");
}

// Tiled copy of the box at element coordinates (col, row) of a 2-D tensor map (host side:
// common/tensor_map.h) into `dst` (1024-byte aligned for a swizzled map). `map` is the address of
// a __grid_constant__ kernel parameter.
__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, int col, int row, std::uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(
          smem_address(dst)),
      "l"(reinterpret_cast<std::uint64_t>(map)), "r"(col), "r"(row), "r"(smem_address(bar))
      : "memory");
}

// The same with an L2 cache policy (createpolicy), e.g. evict-first for weights read once per step.
__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, int col, int row, std::uint64_t* bar,
                                            std::uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, {%2, %3}], [%4], %5;" ::"r"(
          smem_address(dst)),
      "l"(reinterpret_cast<std::uint64_t>(map)), "r"(col), "r"(row), "r"(smem_address(bar)), "l"(policy)
      : "memory");
}

// Pulls `bytes` (a multiple of 16, 16-byte aligned) at `src` into L2: one thread, no completion to
// wait for. For small settled data a body reads right after its wait.
__device__ __forceinline__ void prefetch_l2(const void* src, std::uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src), "r"(bytes) : "memory");
}

// Pulls the line holding `p` into L1 (no register, no completion): for a value a thread reads later.
__device__ __forceinline__ void prefetch_l1(const void* p) {
  asm volatile("prefetch.global.L1 [%0];" ::"l"(p));
}

// Warms the descriptor cache with a tensor map (a __grid_constant__ kernel parameter's address).
__device__ __forceinline__ void prefetch_tensor_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<std::uint64_t>(map)) : "memory");
}

}  // namespace encore::device
