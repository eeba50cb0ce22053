// Split-KV attention (docs/mla.md §8): how the 64-token pages reach shared memory. Each page slot fills
// by TMA tiled copies (9 boxes of 64 tokens x 64 values through a tensor map of the page pool, in
// the 128-byte swizzled layout of common/wgmma.cuh), issued by thread 0 and completing on one
// mbarrier per slot; rows beyond the sequence length are zeroed once the page has landed. (One
// mbarrier per column block, so the scores could start on a page's first blocks, was faster at
// B = 1 and slower from 64 x 4K; bench/notes/2026-12-02_to_12-04-op-sessions.md.)
#pragma once

#include <cstdint>

#include <cuda.h>

#include <encore/ops/mla.h>

#include "common/async_copy.cuh"
#include "common/block.h"
#include "mla/mla_device.cuh"
#include "mla/mla_splitkv_layout.cuh"

namespace encore::mla {

namespace dev = encore::device;

// The page slots as every thread of the block tracks them (each thread takes the same decisions,
// thread 0 issues the copies): per slot, the parity of its barrier's next phase, whether a copy
// is in flight, and how many of the page's token rows are real.
struct PageRing {
  const CUtensorMap* map;  // the __grid_constant__ SplitKvArgs::pages
  std::uint64_t* full;     // SplitKvSmem::page_full
  std::uint32_t parity = 0, in_flight = 0;
  std::uint32_t kept_rows = 0;  // 8 bits per slot
  __device__ int rows(int s) const { return (kept_rows >> (8 * s)) & 0xff; }
};

// Before the first tile: thread 0 initialises the barriers (and warms the tensor map); the block
// barrier publishes them. Cfg: the tile's shape (mla_splitkv_layout.cuh).
template <class Cfg>
__device__ inline PageRing page_ring_init(const CUtensorMap* map, char* smem_base) {
  PageRing st;
  st.map = map;
  st.full = SplitKvSmem<Cfg>(smem_base).page_full;
  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < Cfg::kRingSlots; ++s) dev::barrier_init(st.full + s, 1);
    dev::fence_barrier_init();
    dev::prefetch_tensor_map(map);
  }
  __syncthreads();
  return st;
}

// Page `page_id` -> slot s (`slot` its memory); rows >= valid_tokens are zeroed when it lands
// (wait_page). A page id outside the pool is never read: nothing is copied, the slot is zeroed
// and the step is flagged. Called by all threads with the same arguments.
template <class Cfg>
__device__ inline void issue_page(const MlaAttentionParams& p, PageRing& st, int s, std::int32_t page_id, int valid_tokens,
                                  char* slot) {
  const bool in_pool = page_id >= 0 && page_id < p.cache.num_pages;
  if (threadIdx.x == 0) {
    if (!in_pool) {
      atomicOr(p.error_flag, kMlaErrorPageId);
      dev::barrier_arrive_expect(st.full + s, 0);
    } else {
      dev::barrier_arrive_expect(st.full + s, Cfg::kPageBytes);
#pragma unroll
      for (int b = 0; b < Cfg::kColBlocks; ++b)
        dev::tma_load_2d(slot + b * Cfg::kColBlockBytes, st.map, b * Cfg::kBlockCols, page_id * kMlaPageTokens, st.full + s);
    }
  }
  st.in_flight |= 1u << s;
  st.kept_rows = (st.kept_rows & ~(0xffu << (8 * s))) | (std::uint32_t(in_pool ? valid_tokens : 0) << (8 * s));
}

// Waits for slot s's page, if one is in flight, and zeroes its rows past the sequence (whole
// 128-byte rows: the swizzle only permutes chunks within a row). All threads.
template <class Cfg>
__device__ inline void wait_page(PageRing& st, int s, char* slot) {
  if (!((st.in_flight >> s) & 1)) return;
  dev::barrier_wait(st.full + s, (st.parity >> s) & 1);
  st.parity ^= 1u << s;
  st.in_flight &= ~(1u << s);
  const int kept = st.rows(s);
  if (kept < kMlaPageTokens) {
    const int chunks_per_block = (kMlaPageTokens - kept) * 8;
    for (int c = threadIdx.x; c < Cfg::kColBlocks * chunks_per_block; c += kBlockThreads) {
      const int b = c / chunks_per_block, r = c % chunks_per_block;
      *reinterpret_cast<uint4*>(slot + b * Cfg::kColBlockBytes + kept * 128 + r * 16) = make_uint4(0, 0, 0, 0);
    }
    dev::fence_proxy_async();  // the zeros, visible to the tensor cores' reads
    __syncthreads();
  }
}

// Every copy in flight has landed (before the slots are reused for something else).
template <class Cfg>
__device__ inline void drain_pages(PageRing& st, char* slots) {
#pragma unroll
  for (int s = 0; s < Cfg::kRingSlots; ++s) wait_page<Cfg>(st, s, slots + s * Cfg::kPageBytes);
}

// Plan settled (MlaAttentionParams::plan_settled), before griddepcontrol.wait: starts the copies
// of the part's first pages but the newest. Returns the first request's pages for splitkv_part.
template <class Cfg>
__device__ inline RequestPages<Cfg> start_settled_pages(const MlaAttentionParams& p, const MlaPartPlan& plan, char* smem_base,
                                                        PageRing& st) {
  const RequestPages<Cfg> r = request_pages<Cfg>(p, plan, plan.begin_req);
  char* slots = SplitKvSmem<Cfg>(smem_base).page;
#pragma unroll
  for (int s = 0; s < Cfg::kRingSlots; ++s)
    if (s < r.num_pages && !r.newest(s)) issue_page<Cfg>(p, st, s, r.first_ids[s], r.valid_tokens(s), slots + s * Cfg::kPageBytes);
  return r;
}

}  // namespace encore::mla
