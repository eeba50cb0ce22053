// Device bodies of greedy decoding (include/encore/ops/sample.h), in the body contract of
// common/body.cuh: the partial argmax (tile = one chunk of one row's logits) and the advance
// (tile = one row: reduce its chunks, pick the next token, move the row on).
#pragma once

#include <cstdint>

#include <cub/block/block_reduce.cuh>
#include <math_constants.h>

#include <encore/ops/sample.h>

#include "common/block.h"
#include "common/body.cuh"
#include "common/smem_allocator.cuh"

namespace encore::sample {

using ops::GreedyParams;
using ops::greedy_chunks;
using ops::kSampleChunk;
using ops::kSampleRowOutOfRoom;

// A candidate token: its logit and id. NaN logits enter as -inf, so they never win over a number;
// the identity's id (INT32_MAX) loses every tie, so a row of -inf / NaN picks id 0.
struct Candidate {
  float value;
  std::int32_t id;
};
__device__ inline Candidate no_candidate() { return {-CUDART_INF_F, 0x7fffffff}; }
struct BetterCandidate {
  __device__ Candidate operator()(const Candidate& a, const Candidate& b) const {
    return (b.value > a.value || (b.value == a.value && b.id < a.id)) ? b : a;
  }
};

// The workspace: per row, each chunk's best value and id.
struct GreedyWorkspace {
  float* values;       // [batch][chunks]
  std::int32_t* ids;   // [batch][chunks]
  __host__ __device__ GreedyWorkspace(void* base, int batch, int vocab) {
    const std::size_t n = std::size_t(batch) * std::size_t(greedy_chunks(vocab));
    values = static_cast<float*>(base);
    ids = reinterpret_cast<std::int32_t*>(values + (n + 3) / 4 * 4);
  }
};

struct GreedySmem {
  using Reduce = cub::BlockReduce<Candidate, kBlockThreads>;
  typename Reduce::TempStorage* reduce;
  std::size_t bytes;
  __host__ __device__ explicit GreedySmem(char* base) {
    encore::device::SmemAllocator a(base);
    reduce = a.take<typename Reduce::TempStorage>(1, alignof(typename Reduce::TempStorage));
    bytes = a.used();
  }
};

__device__ inline Candidate candidate_at(const float* row, int id) {
  const float v = row[id];  // plain load: the logits come from the same step
  return {v != v ? -CUDART_INF_F : v, id};
}

// ---- partial argmax (tile = row * chunks + chunk) ----------------------------------------------
__device__ inline void argmax_chunk_tile(const GreedyParams& p, const GreedyWorkspace& ws, const GreedySmem& s, int tile) {
  const int chunks = greedy_chunks(p.vocab);
  const int row = tile / chunks, chunk = tile % chunks;
  const float* logits = p.logits + std::int64_t(row) * p.logits_stride;
  const int first = chunk * kSampleChunk;
  const int last = first + kSampleChunk < p.vocab ? first + kSampleChunk : p.vocab;
  Candidate best = no_candidate();
  const BetterCandidate better;
#pragma unroll 4
  for (int id = first + int(threadIdx.x); id < last; id += kBlockThreads) best = better(best, candidate_at(logits, id));
  best = GreedySmem::Reduce(*s.reduce).Reduce(best, better);
  if (threadIdx.x == 0) ws.values[tile] = best.value, ws.ids[tile] = best.id;
  __syncthreads();  // the temp storage is reused by the block's next tile
}

template <class Range, class Wait>
__device__ inline void argmax_chunk_body(const GreedyParams& p, const Range& r, Wait& wait, char* smem) {
  const GreedyWorkspace ws(p.workspace, p.batch, p.vocab);
  const GreedySmem s(smem);
  wait();
  const int tiles = p.batch * greedy_chunks(p.vocab);
  for (int tile = r.first(); tile < tiles; tile += r.stride()) argmax_chunk_tile(p, ws, s, tile);
}

// ---- advance (tile = row) ----------------------------------------------------------------------
// Where row b's next position lands, or false when it has no room there.
__device__ inline bool has_room(const GreedyParams& p, int row, int next_pos) {
  if (next_pos >= p.capacity) return false;
  const int page = p.block_table[std::int64_t(row) * p.max_pages_per_seq + next_pos / p.page_size];
  return page >= 0 && page < p.max_pages;
}

__device__ inline void advance_row_tile(const GreedyParams& p, const GreedyWorkspace& ws, const GreedySmem& s, int row) {
  const int chunks = greedy_chunks(p.vocab);
  Candidate best = no_candidate();
  const BetterCandidate better;
  for (int c = int(threadIdx.x); c < chunks; c += kBlockThreads)
    best = better(best, Candidate{ws.values[row * chunks + c], ws.ids[row * chunks + c]});
  best = GreedySmem::Reduce(*s.reduce).Reduce(best, better);
  if (threadIdx.x == 0 && p.slot_ids[row] >= 0 && p.seq_lens[row] > 0) {
    const int next_pos = p.positions[row] + 1;
    std::int32_t* history = p.tokens + std::int64_t(row) * p.capacity;
    if (!has_room(p, row, next_pos)) {
      p.slot_ids[row] = -1, p.seq_lens[row] = 0;
      atomicOr(p.flags, kSampleRowOutOfRoom);  // an integer flag, not data
    } else {
      const std::int32_t next = next_pos < p.prompt_lens[row] ? history[next_pos] : best.id;
      history[next_pos] = next;
      p.token_ids[row] = next, p.positions[row] = next_pos, p.seq_lens[row] = next_pos + 1;
    }
  }
  __syncthreads();
}

template <class Range, class Wait>
__device__ inline void advance_body(const GreedyParams& p, const Range& r, Wait& wait, char* smem) {
  const GreedyWorkspace ws(p.workspace, p.batch, p.vocab);
  const GreedySmem s(smem);
  wait();
  for (int row = r.first(); row < p.batch; row += r.stride()) advance_row_tile(p, ws, s, row);
}

}  // namespace encore::sample
