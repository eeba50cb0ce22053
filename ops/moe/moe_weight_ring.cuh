// A ring of shared-memory stages that bulk copies (TMA, cp.async.bulk) fill with the weight rows
// of a block's upcoming items, each stage signalled by an mbarrier. With S stages a block has up to
// S items' weights in flight while it computes, and every weight byte is read from HBM once
// whatever the number of token passes over it.
#pragma once

#include <cstdint>

#include "common/launch.cuh"

namespace encore::moe {

inline constexpr int kMaxRingStages = 4;
inline constexpr std::size_t kRingHeaderBytes = 128;  // the stages' mbarriers, padded

__device__ __forceinline__ std::uint32_t smem_address(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbarrier_init(std::uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_address(bar)), "r"(count) : "memory");
}

// One arrival that also announces `bytes` of bulk-copy traffic for the current phase.
__device__ __forceinline__ void mbarrier_expect_bytes(std::uint64_t* bar, std::uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_address(bar)), "r"(bytes) : "memory");
}

__device__ __forceinline__ void mbarrier_wait(std::uint64_t* bar, std::uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n"
      "}\n" ::"r"(smem_address(bar)),
      "r"(parity)
      : "memory");
}

// Global -> shared bulk copy of `bytes` (a multiple of 16; both addresses 16-byte aligned),
// completing on `bar`.
__device__ __forceinline__ void bulk_copy_to_smem(void* dst, const void* src, std::uint32_t bytes, std::uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(smem_address(dst)),
               "l"(src), "r"(bytes), "r"(smem_address(bar))
               : "memory");
}

struct WeightRing {
  std::uint64_t* bars;      // [stages]
  char* data;               // [stages][stage_bytes]
  std::uint32_t stage_bytes;  // a multiple of 128
  int stages;               // 1..kMaxRingStages
  __device__ char* stage(int s) const { return data + std::size_t(s) * stage_bytes; }
};

// Host and device: the ring's shared-memory bytes (header + stages).
__host__ __device__ constexpr std::size_t ring_smem_bytes(std::size_t stage_bytes, int stages) {
  return kRingHeaderBytes + (stage_bytes + 127) / 128 * 128 * stages;
}
__device__ inline WeightRing make_ring(char* smem, std::size_t stage_bytes, int stages) {
  return {reinterpret_cast<std::uint64_t*>(smem), smem + kRingHeaderBytes, std::uint32_t((stage_bytes + 127) / 128 * 128), stages};
}

// Persistent item loop over items blockIdx.x, +gridDim.x, ...: thread 0 keeps the next `stages`
// items' copies in flight (issue(item, dst, bar) issues them, `bytes` in all); body(item, stage)
// runs once the item's weights have landed. Whole block.
template <class Issue, class Body>
__device__ __forceinline__ void ring_item_loop(const WeightRing& ring, int items, std::uint32_t bytes, Issue issue, Body body) {
  if (threadIdx.x == 0) {
    for (int s = 0; s < ring.stages; ++s) mbarrier_init(ring.bars + s, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    for (int s = 0; s < ring.stages; ++s) {
      const int item = int(blockIdx.x) + s * int(gridDim.x);
      if (item >= items) break;
      mbarrier_expect_bytes(ring.bars + s, bytes);
      issue(item, ring.stage(s), ring.bars + s);
    }
  }
  __syncthreads();
  for (int n = 0;; ++n) {
    const int item = int(blockIdx.x) + n * int(gridDim.x);
    if (item >= items) break;
    const int s = n % ring.stages;
    mbarrier_wait(ring.bars + s, std::uint32_t(n / ring.stages) & 1u);
    body(item, static_cast<const char*>(ring.stage(s)));
    __syncthreads();  // every reader of stage s is done before it is refilled
    const int next = item + ring.stages * int(gridDim.x);
    if (threadIdx.x == 0 && next < items) {
      mbarrier_expect_bytes(ring.bars + s, bytes);
      issue(next, ring.stage(s), ring.bars + s);
    }
  }
}

}  // namespace encore::moe
