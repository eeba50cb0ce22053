// The expert stage's epilogues (docs/moe.md §6-§7): the sub-block quantiser that turns gate/up's
// silu(g)*u into the down projection's int8 input, and the ordered combine that the last down item
// of a row chunk runs: x[t][row] += sum_j w_j * y[entry_j][row] over a token's entries in ascending
// expert id (shared last). One owner per output element, no float atomics.
#pragma once

#include <cstdint>

#include "common/block.h"
#include "moe/moe_work_list.cuh"
#include "q4k/activation_q8.cuh"

namespace encore::moe {

// ---- the silu(g)*u quantiser --------------------------------------------------------------------

// Quantises the 32 values mid[0..31] as sub-block `sub_block` of a 256-value block and writes only
// that sub-block's codes and meta to `out`. q4k::quantize_act_block does the arithmetic on a
// per-warp scratch block (the lanes of the other sub-blocks hold zeros; sub-blocks are
// independent); the copy follows the layout documented in q4k/activation_q8.cuh: the sub-block's
// 32 codes are contiguous at half*128 + 32*(sub_block/2), its {d, sum} at meta[c].{x|y, z|w} of
// chunks c = 2*(sub_block/2) + {0, 1}. Whole warp.
__device__ __forceinline__ void quantize_sub_block(const float* mid, int sub_block, char* scratch, char* out) {
  const int lane = threadIdx.x % 32;
  float v[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) v[i] = lane / 4 == sub_block ? mid[(lane % 4) * 8 + i] : 0.f;
  q4k::quantize_act_block(v, scratch);
  __syncwarp();
  const int half = sub_block % 2, pair = sub_block / 2;
  if (lane < 8) {
    const int at = half * 128 + pair * 32 + lane * 4;
    *reinterpret_cast<std::uint32_t*>(out + at) = *reinterpret_cast<const std::uint32_t*>(scratch + at);
  } else if (lane < 12) {
    const int q = lane - 8;  // chunk 2*pair + q/2; field d (q even) or sum (q odd) of this half
    const int at = 256 + ((2 * pair + q / 2) * 4 + (q % 2) * 2 + half) * 4;
    *reinterpret_cast<float*>(out + at) = *reinterpret_cast<const float*>(scratch + at);
  }
  __syncwarp();
}

// ---- the ordered combine ------------------------------------------------------------------------

// The combine's view of the work list: every token's entries and their weights, staged once per
// block in shared memory (they are the same for every row chunk).
struct CombineLists {
  int* entries;   // [batch][k+S], -1 after the token's last entry
  float* weight;  // [batch][k+S]
};
__host__ __device__ inline std::size_t combine_lists_bytes(int batch, int per_token) {
  return std::size_t(batch) * per_token * (sizeof(int) + sizeof(float));
}
// The down block's list of the chunks it combines ({count, chunk...}), ahead of the staged lists.
__host__ __device__ inline std::size_t combine_chunk_list_bytes(int max_items) {
  return ((std::size_t(max_items) + 1) * sizeof(int) + 15) & ~std::size_t(15);
}
__device__ inline CombineLists stage_combine_lists(const ExpertsTileParams& p, const WorkList& list, char* scratch) {
  const int lists = p.batch * (p.top_k + p.num_shared);
  CombineLists l{reinterpret_cast<int*>(scratch), reinterpret_cast<float*>(scratch) + lists};
  for (int i = threadIdx.x; i < lists; i += kBlockThreads) {
    const int entry = load_list(list.token_entries + i);
    l.entries[i] = entry;
    l.weight[i] = entry >= 0 ? load_list(list.entry_weight + entry) : 0.f;
  }
  return l;
}

// x[t][row] += sum over the token's entries (ascending expert id, shared last) of w * y, for the
// kDownRows rows of each of the `count` chunks in `chunks`, all in one parallel pass: a block
// that is last for several chunks would otherwise pay their L2 round trips one after another.
// Each thread keeps kOutputsInFlight outputs' loads in flight. y comes from other blocks: read
// through L2 (ld.global.cg). The lists must be staged and a block barrier passed. Each output is
// x + (its entries' sum in list order) whatever the chunk count.
__device__ inline void combine_chunks(const ExpertsTileParams& p, const CombineLists& l, const int* chunks, int count) {
  constexpr int kOutputsInFlight = 4;  // per thread: their loads issue together, then the stores
  const int per_token = p.top_k + p.num_shared, chunk_rows = p.batch * kDownRows, outputs = count * chunk_rows;
  for (int base = threadIdx.x; base < outputs; base += kOutputsInFlight * kBlockThreads) {
    float acc[kOutputsInFlight];
    std::int64_t at[kOutputsInFlight];
#pragma unroll
    for (int u = 0; u < kOutputsInFlight; ++u) {
      const int i = base + u * kBlockThreads, t = i % chunk_rows / kDownRows;
      at[u] = -1;
      if (i >= outputs || device::is_pad_row(p.slot_ids, t)) continue;
      const std::int64_t row = std::int64_t(chunks[i / chunk_rows]) * kDownRows + i % kDownRows;
      at[u] = t * std::int64_t(p.hidden) + row;
      acc[u] = p.x[at[u]];
      float sum = 0.f;
#pragma unroll 4
      for (int j = 0; j < per_token; ++j) {
        const int entry = l.entries[t * per_token + j];  // -1 after the token's last entry
        if (entry >= 0) sum += l.weight[t * per_token + j] * __ldcg(p.y + entry * std::int64_t(p.hidden) + row);
      }
      acc[u] += sum;
    }
#pragma unroll
    for (int u = 0; u < kOutputsInFlight; ++u)
      if (at[u] >= 0) p.x[at[u]] = acc[u];
  }
}

}  // namespace encore::moe
