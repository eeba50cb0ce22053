// The combine fused into the split-KV kernel (mla_attention with counters): the parts of a split
// request meet on its counter. A request split in two is merged in its first split's epilogue
// (fused_pair_merge); one with more splits is merged in slices at the tiles' end (fused_combine).
// Both merge with combine_items (mla_combine.cuh): the same bits as mla_combine.
#pragma once

#include <cmath>
#include <cstdint>

#include <encore/ops/mla.h>

#include "common/block.h"
#include "mla/mla_combine.cuh"
#include "mla/mla_device.cuh"
#include "mla/mla_splitkv_layout.cuh"

namespace encore::mla {

// Fused combine staging in the free page slots: combine_items' reduction space, the slice's
// weights, then its partials. A slice holds at most items / splits + 1 float4 items of each split
// and spans at most items / splits / 128 + 2 head rows, so items + splits float4 and 8 splits + 128
// bytes of weights bound it (checked against the slots by fused_combine_fits).
__host__ __device__ inline int fused_combine_weight_bytes(int slice_heads, int splits) { return (slice_heads * splits * 4 + 15) / 16 * 16; }
__host__ __device__ inline bool fused_combine_fits(int max_splits) {
  const int items = SplitKvConfig::kRows * kFloat4PerRow;
  return kCombineRedBytes + (items + max_splits) * 16 + 8 * max_splits + 128 + 16 <=
         std::size_t(SplitKvConfig::kRingSlots) * SplitKvConfig::kPageBytes;
}

__device__ __forceinline__ std::int32_t* fused_counter(const MlaAttentionParams& p, int req, int group) {
  return p.counters + std::int64_t(req) * head_groups<SplitKvConfig>(p.num_heads) + group;
}

// Fused combine, arrival: this part's partial of (request, head group) is written (by all
// threads, before the barrier); the release increment orders it before the count.
__device__ __forceinline__ void fused_arrive(std::int32_t* counter) {
  __syncthreads();
  if (threadIdx.x == 0) add_release_gpu(counter, 1);
}

// Slice `split_idx` of `splits` of a head group's float4 items: what that part merges.
struct ItemRange {
  int begin, end;
};
__device__ inline ItemRange fused_combine_slice(const MlaAttentionParams& p, int group, int split_idx, int splits) {
  const int head0 = group * SplitKvConfig::kRows, heads = min(SplitKvConfig::kRows, p.num_heads - head0);
  const int items = heads * kFloat4PerRow, item0 = head0 * kFloat4PerRow;
  return {item0 + split_idx * items / splits, item0 + (split_idx + 1) * items / splits};
}

// Fused combine of one split request: wait until all `splits` parts have arrived, merge slice
// `split_idx` of the group's float4 items (disjoint slices, mla_combine's order), then leave; the
// last part to leave (count 2 splits) resets the counter to zero for the next call. The slice's
// partials are copied into `smem` (the free page slots) in one round, their weights computed
// meanwhile: the merge costs a few L2 / DRAM round trips, not one per pass of items. A flagged step
// merges nothing but still keeps the counter protocol.
__device__ inline void fused_combine(const MlaAttentionParams& p, int req, int group, int split_idx, bool write,
                                     std::int32_t* counter, char* smem) {
  const int first = p.num_splits[req];
  const int splits = p.num_splits[req + 1] - first;
  if (threadIdx.x == 0) wait_count_acquire(counter, splits);
  __syncthreads();  // (with thread 0's acquire: the other parts' partials are visible to all)
  const auto [begin, end] = fused_combine_slice(p, group, split_idx, splits);
  if (write && begin < end) {  // uniform over the block
    const int n = end - begin, h_lo = begin / kFloat4PerRow, slice_heads = (end - 1) / kFloat4PerRow - h_lo + 1;
    float4* red = reinterpret_cast<float4*>(smem);
    float* weight = reinterpret_cast<float*>(smem + kCombineRedBytes);  // [heads of the slice][splits]
    float4* staged = reinterpret_cast<float4*>(smem + kCombineRedBytes + fused_combine_weight_bytes(slice_heads, splits));  // [splits][n]
    const std::int64_t slot_stride = std::int64_t(p.num_heads) * kFloat4PerRow;
    const float4* po = reinterpret_cast<const float4*>(p.partial_o) + std::int64_t(first) * slot_stride + begin;
    for (int idx = threadIdx.x; idx < splits * n; idx += kBlockThreads) {
      const int i = idx / n;
      device::cp_async_16(staged + idx, po + i * slot_stride + (idx - i * n));
    }
    device::cp_async_commit();
    for (int idx = threadIdx.x; idx < slice_heads * splits; idx += kBlockThreads)
      weight[idx] = __ldcg(p.partial_lse + std::int64_t(first + idx % splits) * p.num_heads + h_lo + idx / splits);
    __syncthreads();  // the LSEs are in place
    const int warp = threadIdx.x / 32;
    for (int h = h_lo + warp; h < h_lo + slice_heads; h += kWarpsPerBlock) {
      const float lse = combine_weights_from_lse(splits, weight + (h - h_lo) * splits);
      // The slice holding a row's first item writes the row's LSE.
      if (threadIdx.x % 32 == 0 && h * kFloat4PerRow >= begin) p.lse[std::int64_t(req) * p.num_heads + h] = lse;
    }
    device::cp_async_wait<0>();
    __syncthreads();  // weights and the staged partials are in place
    combine_items(p, req, splits, begin, end, weight, h_lo, red, PartialsStaged{staged, begin, n});  // ends with a barrier
  }
  if (threadIdx.x == 0 && atomicAdd(counter, 1) == 2 * splits - 1) atomicExch(counter, 0);
}

// A request split in exactly two is merged by the part holding its split 0, in that split's
// epilogue: split 0 is the part's last request and split 1 the next part's first, long done by
// then, so the owner's own partial never leaves shared memory and nobody waits at the tile's end.
// The partner only arrives. Requests with more splits use fused_combine.
__device__ __forceinline__ bool fused_pair(const MlaAttentionParams& p, int req) { return p.num_splits[req + 1] - p.num_splits[req] == 2; }

// Where combine_items reads a pair's splits: split 0 from this part's unnormalised O rows in
// shared memory, scaled by 1 / l exactly as its partial would have been stored, split 1 staged.
struct PairPartials {
  const float* o_rows;   // [rows][kOutStride]
  const float* row_sum;   // [rows]
  const float4* partner;  // [rows][128]
  int item0;              // item of row 0
  __device__ float4 operator()(int i, int item) const {
    const int it = item - item0;
    if (i == 1) return partner[it];
    const int row = it / kFloat4PerRow;
    const float l = row_sum[row];
    const float inv = inverse_row_sum(l);
    const float4 v = *reinterpret_cast<const float4*>(o_rows + row * SplitKvConfig::kOutStride + (it % kFloat4PerRow) * 4);
    return make_float4(v.x * inv, v.y * inv, v.z * inv, v.w * inv);
  }
};

static_assert(SplitKvConfig::kWarpgroups * SplitKvConfig::kRows * SplitKvConfig::kPartialStride * 4 >= kCombineRedBytes, "the pair merge reduces in the score partials");
static_assert(SplitKvConfig::kRows * (SplitKvConfig::kOutStride + kMlaLatentDim) * 4 <= SplitKvConfig::kRingSlots * SplitKvConfig::kPageBytes, "O and the partner's partial fit the slots");

// Pair merge (all threads), split 0's epilogue: o_rows holds this part's unnormalised O rows
// ([32][kOutStride], fp32), sm.row_sum / row_max their statistics. Waits for split 1, copies its
// partial after o_rows, and merges with combine_items: the same bits as storing split 0 and
// merging both. Resets the counter.
__device__ inline void fused_pair_merge(const MlaAttentionParams& p, int req, int group, const SplitKvSmem<>& sm, const float* o_rows) {
  std::int32_t* counter = fused_counter(p, req, group);
  const int partner = p.num_splits[req] + 1;
  const int head0 = group * SplitKvConfig::kRows, heads = min(SplitKvConfig::kRows, p.num_heads - head0);
  if (threadIdx.x == 0) wait_count_acquire(counter, 1);
  __syncthreads();  // (with thread 0's acquire: the partner's partial is visible to all)
  float4* staged = reinterpret_cast<float4*>(sm.page + SplitKvConfig::kRows * SplitKvConfig::kOutStride * 4);  // [heads][128]
  const float4* src = reinterpret_cast<const float4*>(p.partial_o + (std::int64_t(partner) * p.num_heads + head0) * kMlaLatentDim);
  for (int it = threadIdx.x; it < heads * kFloat4PerRow; it += kBlockThreads) device::cp_async_16(staged + it, src + it);
  device::cp_async_commit();
  float* weight = reinterpret_cast<float*>(sm.probs);  // [heads][2]: the splits' LSEs, then their weights
  if (threadIdx.x < heads) {
    const int row = threadIdx.x;
    const float l = sm.row_sum[row];
    weight[2 * row] = l > 0.f ? (sm.row_max[row] + log2f(l)) * 0.6931471805599453f : -INFINITY;  // as its partial LSE
    weight[2 * row + 1] = __ldcg(p.partial_lse + std::int64_t(partner) * p.num_heads + head0 + row);
  }
  __syncthreads();
  for (int h = threadIdx.x / 32; h < heads; h += kWarpsPerBlock) {
    const float lse = combine_weights_from_lse(2, weight + 2 * h);
    if (threadIdx.x % 32 == 0) p.lse[std::int64_t(req) * p.num_heads + head0 + h] = lse;
  }
  device::cp_async_wait<0>();
  __syncthreads();  // weights and the partner's partial are in place
  const int item0 = head0 * kFloat4PerRow;
  combine_items(p, req, 2, item0, item0 + heads * kFloat4PerRow, weight, head0, reinterpret_cast<float4*>(sm.partial),
                PairPartials{o_rows, sm.row_sum, staged, item0});  // ends with a barrier
  if (threadIdx.x == 0) atomicExch(counter, 0);  // the partner arrived once and is gone
}

// Pair owner without math (flagged step): keeps the protocol, writes nothing.
__device__ __forceinline__ void fused_pair_skip(std::int32_t* counter) {
  if (threadIdx.x == 0) {
    wait_count_acquire(counter, 1);
    atomicExch(counter, 0);
  }
}

}  // namespace encore::mla
