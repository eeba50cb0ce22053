// Hopper warpgroup MMA (wgmma.mma_async) on shared-memory operands in the 128-byte swizzled
// layout: the operand is stored as 8-row x 128-byte atoms (1 KB, 1024-byte aligned) in which the
// 16-byte chunk c of row r sits at chunk position c ^ (r % 8). `swizzled_offset` gives that
// address; the descriptors below describe such tiles to the tensor cores.
#pragma once

#include <cstdint>

#include "common/async_copy.cuh"

namespace encore::device {

inline constexpr int kSwizzleAtomBytes = 1024;  // 8 rows x 128 bytes

// Byte offset of 16-byte chunk `chunk` (0..7) of row `row` in a 128-byte-row swizzled tile.
__host__ __device__ constexpr int swizzled_offset(int row, int chunk) { return row * 128 + ((chunk ^ (row % 8)) * 16); }

// Descriptor of a 128-byte-swizzled operand at `tile`. K-major (rows hold K): the 8-row groups
// are `group_stride` bytes apart; a k16 step inside the 128-byte row is a +32-byte start address.
// MN-major (rows hold MN, K runs over rows): 8-row groups along K are `group_stride` apart. With
// at most 64 MN elements per operand only one atom column is used, so both offset fields can
// carry the same stride. `at(bytes)` moves the start address only (the low word: shared-memory
// addresses stay below 2^18 bytes, so the 14-bit field never carries).
struct WgmmaDesc {
  std::uint32_t lo, hi;
  __device__ __forceinline__ WgmmaDesc(const void* tile, std::uint32_t group_stride)
      : lo((smem_address(tile) & 0x3FFFF) >> 4 | (group_stride >> 4) << 16), hi((group_stride >> 4) | 1u << 30) {}
  __device__ __forceinline__ std::uint64_t at(std::uint32_t bytes) const {
    return std::uint64_t(hi) << 32 | (lo + (bytes >> 4));
  }
};

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// d (+)= A(64x16) * B(16x32), bf16 in, fp32 accumulate; `accumulate` = false overwrites d.
// kTransA: A is MN-major (its 64 M elements contiguous per K row). B is K-major.
// Accumulator layout (per warp w of the warpgroup, lane l): d[4j + e] is row 16w + l/4 + 8(e/2),
// column 8j + 2(l%4) + e%2.
template <int kTransA>
__device__ __forceinline__ void wgmma_m64n32k16_bf16(float (&d)[16], std::uint64_t desc_a, std::uint64_t desc_b,
                                                     bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, %16, %17, p, 1, 1, %19, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(desc_a), "l"(desc_b), "r"(int(accumulate)), "n"(kTransA));
}

// The same with N = 16 (B is 16 x 16): d[4j + e], j < 2, in the layout above.
template <int kTransA>
__device__ __forceinline__ void wgmma_m64n16k16_bf16(float (&d)[8], std::uint64_t desc_a, std::uint64_t desc_b, bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7}, %8, %9, p, 1, 1, %11, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "l"(desc_a), "l"(desc_b), "r"(int(accumulate)), "n"(kTransA));
}

// d (+)= A(64x16) * B(16xN) for N = 16 or 32, as above.
template <int N, int kTransA>
__device__ __forceinline__ void wgmma_m64k16_bf16(float (&d)[N / 2], std::uint64_t desc_a, std::uint64_t desc_b, bool accumulate) {
  static_assert(N == 16 || N == 32, "instantiated for N = 16 and 32");
  if constexpr (N == 32)
    wgmma_m64n32k16_bf16<kTransA>(d, desc_a, desc_b, accumulate);
  else
    wgmma_m64n16k16_bf16<kTransA>(d, desc_a, desc_b, accumulate);
}

}  // namespace encore::device
