// Split-KV attention body (docs/mla.md §8): one tile = (scheduler part, group of kRows query heads:
// 32 in the op's shape, 16 in the shape for half an SM; mla_splitkv_layout.cuh).
// Per 64-token page: S = Q K^T and O += P V on the warpgroup tensor cores (wgmma, bf16 in, fp32
// accumulate, every operand read from shared memory), online softmax in base 2, P rounded to bf16.
// One page in shared memory serves K (576 columns) and V (its first 512 columns). Pages stream
// through a ring of TMA slots (two, or one in the half-SM shape; mla_page_ring.cuh; layout:
// mla_splitkv_layout.cuh); split requests are merged by mla_combine or, fused, by
// mla_fused_combine.cuh. (Other shapes of this body that were measured and dropped: bench/notes/.)
//
// Warpgroup roles (2 warpgroups, 256 threads; N = kRows):
//   scores:  S^T = K Q^T (M = 64 tokens, N heads); warpgroup g takes the k16 steps 2 s + g
//            (s < 18); the two partials are added in order by the softmax.
//   softmax: thread t < 8 N owns head row t/8, tokens 8*(t%8)..+7; writes P (bf16) as [head][token].
//   P V:     O^T = V^T P^T (M = 64 latent columns per wgmma, N heads, K = 64 tokens);
//            warpgroup g owns the output columns 256g..256g+255.
// Every (token, head) score and output element runs the same k steps in the same order in either
// shape, so the shapes give the same bits.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include <encore/ops/mla.h>

#include "common/body.cuh"
#include "common/block.h"
#include "common/async_copy.cuh"
#include "common/wgmma.cuh"
#include "mla/mla_device.cuh"
#include "mla/mla_fused_combine.cuh"
#include "mla/mla_page_ring.cuh"
#include "mla/mla_plan.h"
#include "mla/mla_splitkv_layout.cuh"

namespace encore::mla {

// Every (request, page range) of one part for the heads of `group`: scores, online softmax and
// P V per page, then the final output or this split's partial (and, fused, the arrival).
// `started`: the first request's pages, whose copies start_settled_pages() began (when early).
// Marks (device::mark, traced megakernel only), per request, as item `tile`: its query and first
// page landed, its pages computed, its output or partial stored.
template <class Cfg, SplitKvVariant kVariant, bool kFusedCombine, class Wait>
__device__ inline void splitkv_part(const MlaAttentionParams& p, int group, const MlaPartPlan& plan, char* smem_base,
                                    PageRing& st, bool early_start, RequestPages<Cfg> started, Wait& wait, int tile) {
  namespace dev = encore::device;
  constexpr bool kMath = kVariant != SplitKvVariant::kLoadsOnly;
  constexpr int kAcc = Cfg::kAccPerThread;
  const int begin_req = plan.begin_req, end_req = plan.end_req;
  SplitKvSmem<Cfg> sm(smem_base);
  // Warp index through a shuffle so the compiler knows it is warp-uniform: the descriptors
  // derived from it then live in uniform registers (no per-wgmma conversions).
  const int warp = __shfl_sync(0xffffffffu, threadIdx.x / 32, 0), lane = threadIdx.x % 32;
  const int wg = warp / 4, wg_warp = warp % 4;  // warpgroup, warp within it
  const float scale_log2 = p.softmax_scale * 1.4426950408889634f;  // scores in log2 units, fp32
  // Operand descriptors at this warpgroup's first k step (scores: k steps 2 s + wg, so step s
  // sits in column block s / 2 at +32 (2 (s % 2) + wg) bytes) and first output column block.
  const dev::WgmmaDesc q_desc(sm.q + wg * 32, dev::kSwizzleAtomBytes);
  const dev::WgmmaDesc k_desc(sm.page + wg * 32, dev::kSwizzleAtomBytes);
  const dev::WgmmaDesc v_desc(sm.page + wg * Cfg::kOutBlocksPerGroup * Cfg::kColBlockBytes, dev::kSwizzleAtomBytes);
  const dev::WgmmaDesc p_desc(sm.probs, dev::kSwizzleAtomBytes);

  for (int req = begin_req; req <= end_req; ++req) {
    const bool early = early_start && req == begin_req;  // its settled pages are copying already
    const RequestPages<Cfg> r = early ? started : request_pages<Cfg>(p, plan, req);
    const int page_begin = r.page_begin, token_end = r.token_end, num_pages = r.num_pages;
    const int split_idx = req == begin_req ? plan.begin_split : 0;
    const int split_base = p.num_splits[req];
    const bool is_split = p.num_splits[req + 1] - split_base > 1;

    dev::fence_proxy_async();  // the staged O and merges (generic writes) before the next copies
    __syncthreads();           // previous request's readers of q / stats / staged O are done
    if (threadIdx.x < Cfg::kRows) {
      sm.row_max[threadIdx.x] = -INFINITY;
      sm.row_sum[threadIdx.x] = 0.f;
    }
    load_q<Cfg>(p, req, group, sm.q);  // awaited at the first page
    device::cp_async_commit();
    for (int s = 0; s < Cfg::kRingSlots; ++s)  // (early: start_settled_pages already copies every first page but the newest)
      if (s < num_pages && (!early || r.newest(s)))
        issue_page<Cfg>(p, st, s, r.first_ids[s], r.valid_tokens(s), sm.page + s * Cfg::kPageBytes);

    float acc[Cfg::kOutBlocksPerGroup][kAcc];  // O^T: [m64 column block][fragment]
#pragma unroll
    for (int cb = 0; cb < Cfg::kOutBlocksPerGroup; ++cb)
#pragma unroll
      for (int e = 0; e < kAcc; ++e) acc[cb][e] = 0.f;

    for (int i = 0; i < num_pages; ++i) {
      const int pg = page_begin + i;
      const int valid_tokens = min(token_end - pg * kMlaPageTokens, kMlaPageTokens);
      const int slot = i % Cfg::kRingSlots;
      const std::int32_t next_id = i + Cfg::kRingSlots < num_pages ? page_id_of(p, req, pg + Cfg::kRingSlots) : 0;
      wait_page<Cfg>(st, slot, sm.page + slot * Cfg::kPageBytes);
      if (i == 0) {
        device::cp_async_wait<0>();
        dev::fence_proxy_async();  // this thread's query copies, visible to the tensor cores' reads
        __syncthreads();
        device::mark(wait, device::Mark::kItemWeights, tile);
      }
      const std::uint32_t slot_off = slot * Cfg::kPageBytes;

      // ---- scores S^T = K Q^T: 64 tokens x N heads per warpgroup over its k half
      if constexpr (kMath) {
        float s_acc[kAcc];
        dev::wgmma_fence();
#pragma unroll
        for (int s = 0; s < Cfg::kKStepsPerGroup; ++s) {
          const int step_off = (s / 2) * Cfg::kColBlockBytes + (s % 2) * 64, q_off = (s / 2) * Cfg::kQColBlockBytes + (s % 2) * 64;
          dev::wgmma_m64k16_bf16<Cfg::kRows, 0>(s_acc, k_desc.at(slot_off + step_off), q_desc.at(q_off), s > 0);
        }
        dev::wgmma_commit();
        dev::wgmma_wait<0>();
        // Fragment (token 16 w + lane/4 (+8), head 8 j + 2 (lane%4) (+1)) -> partial[wg][head][token].
        float* part = sm.partial + wg * Cfg::kRows * Cfg::kPartialStride;
#pragma unroll
        for (int e = 0; e < kAcc; ++e) {
          const int token = 16 * wg_warp + lane / 4 + 8 * ((e / 2) % 2), head = 8 * (e / 4) + 2 * (lane % 4) + e % 2;
          part[head * Cfg::kPartialStride + token] = s_acc[e];
        }
      }
      __syncthreads();

      // ---- online softmax: 8 threads per row, 8 tokens each (threads past the rows: whole warps idle)
      bool max_moved = false;  // some row's max rose: O must be rescaled
      const bool row_thread = Cfg::kRowThreads == kBlockThreads || int(threadIdx.x) < Cfg::kRowThreads;
      if constexpr (kMath) if (row_thread) {
        const int row = threadIdx.x / 8, sub = threadIdx.x % 8;
        float s[8] = {};
#pragma unroll
        for (int half = 0; half < Cfg::kWarpgroups; ++half) {  // k halves added in a fixed order
          const float* part = sm.partial + (half * Cfg::kRows + row) * Cfg::kPartialStride + sub * 8;
          const float4 lo = *reinterpret_cast<const float4*>(part), hi = *reinterpret_cast<const float4*>(part + 4);
          s[0] += lo.x, s[1] += lo.y, s[2] += lo.z, s[3] += lo.w;
          s[4] += hi.x, s[5] += hi.y, s[6] += hi.z, s[7] += hi.w;
        }
        float page_max = -INFINITY;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          s[j] = sub * 8 + j < valid_tokens ? s[j] * scale_log2 : -INFINITY;
          page_max = fmaxf(page_max, s[j]);
        }
        const float old_max = sm.row_max[row];
#pragma unroll
        for (int o = 1; o < 8; o <<= 1) page_max = fmaxf(page_max, __shfl_xor_sync(0xffffffffu, page_max, o));
        const float new_max = fmaxf(old_max, page_max);  // finite: every page holds a valid token
        float sum = 0.f;
        std::uint32_t packed[4];
#pragma unroll
        for (int j = 0; j < 8; j += 2) {
          const float p0 = exp2f(s[j] - new_max), p1 = exp2f(s[j + 1] - new_max);
          sum += p0 + p1;  // fp32 sum: keeps the LSE exact to fp32 (P itself goes to bf16)
          packed[j / 2] = pack_bf16x2(p0, p1);
        }
        *reinterpret_cast<uint4*>(sm.probs + dev::swizzled_offset(row, sub)) = make_uint4(packed[0], packed[1], packed[2], packed[3]);
        dev::fence_proxy_async();  // P is read by the tensor cores
#pragma unroll
        for (int o = 1; o < 8; o <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        __syncwarp();  // every lane of the row has read row_max before lane 0 updates it
        if (sub == 0) {
          const float alpha = exp2f(old_max - new_max);  // 0 on the first page
          sm.row_alpha[row] = alpha;
          sm.row_sum[row] = sm.row_sum[row] * alpha + sum;
          sm.row_max[row] = new_max;
          max_moved = alpha != 1.f;
        }
      }
      const bool rescale = __syncthreads_or(max_moved);  // (x 1 is exact: skipping it changes no bit)

      // ---- O^T = alpha O^T + V^T P^T: 4 blocks of 64 columns x N heads per warpgroup, k = 64 tokens
      if constexpr (kMath) {
        if (rescale) {
          float alpha[kAcc / 2];  // heads 8 j + 2 (lane%4) + {0, 1}
#pragma unroll
          for (int j = 0; j < kAcc / 4; ++j) {
            alpha[2 * j] = sm.row_alpha[8 * j + 2 * (lane % 4)];
            alpha[2 * j + 1] = sm.row_alpha[8 * j + 2 * (lane % 4) + 1];
          }
#pragma unroll
          for (int cb = 0; cb < Cfg::kOutBlocksPerGroup; ++cb)
#pragma unroll
            for (int e = 0; e < kAcc; ++e) acc[cb][e] *= alpha[2 * (e / 4) + e % 2];
        }
        dev::wgmma_fence();
#pragma unroll
        for (int cb = 0; cb < Cfg::kOutBlocksPerGroup; ++cb)
#pragma unroll
          for (int ks = 0; ks < kMlaPageTokens / 16; ++ks) {
            dev::wgmma_m64k16_bf16<Cfg::kRows, 1>(acc[cb], v_desc.at(slot_off + cb * Cfg::kColBlockBytes + ks * 16 * 128),
                                                  p_desc.at(ks * 32), true);
          }
        dev::wgmma_commit();
        dev::wgmma_wait<0>();
      }
      __syncthreads();  // slot, scores and probs free again

      if (i + Cfg::kRingSlots < num_pages && kVariant != SplitKvVariant::kComputeOnly) {
        const int next = pg + Cfg::kRingSlots;
        issue_page<Cfg>(p, st, slot, next_id, min(token_end - next * kMlaPageTokens, kMlaPageTokens), sm.page + slot * Cfg::kPageBytes);
      }
    }
    device::cp_async_wait<0>();  // (a request without pages never waited for its query)
    drain_pages<Cfg>(st, sm.page);  // (compute-only: the first slots' copies, if never awaited)
    __syncthreads();
    device::mark(wait, device::Mark::kItemComputed, tile);

    // ---- epilogue: O / l and the LSE (natural log) of each row, final or partial slot. O goes
    // through a free slot so the global stores are whole rows.
    const int slot = split_base + split_idx;
    float* o_base = is_split ? p.partial_o + std::int64_t(slot) * p.num_heads * kMlaLatentDim
                             : p.o_lat + std::int64_t(req) * p.num_heads * kMlaLatentDim;
    float* lse_base = is_split ? p.partial_lse + std::int64_t(slot) * p.num_heads : p.lse + std::int64_t(req) * p.num_heads;
    float* o_rows = reinterpret_cast<float*>(sm.page);  // [kRows][kOutStride]
#pragma unroll
    for (int cb = 0; cb < Cfg::kOutBlocksPerGroup; ++cb)
#pragma unroll
      for (int e = 0; e < kAcc; ++e) {
        const int col = (wg * Cfg::kOutBlocksPerGroup + cb) * Cfg::kBlockCols + 16 * wg_warp + lane / 4 + 8 * ((e / 2) % 2);
        const int head = 8 * (e / 4) + 2 * (lane % 4) + e % 2;
        o_rows[head * Cfg::kOutStride + col] = acc[cb][e];
      }
    __syncthreads();
    if constexpr (kFusedCombine)
      if (is_split && split_idx == 0 && fused_pair(p, req)) {
        fused_pair_merge(p, req, group, sm, o_rows);
        continue;  // no partial and no arrival: the output is written
      }
    constexpr int kRowFloat4 = kMlaLatentDim / 4;
    for (int it = threadIdx.x; it < Cfg::kRows * kRowFloat4; it += kBlockThreads) {
      const int row = it / kRowFloat4, c4 = it % kRowFloat4;
      const int head = group * Cfg::kRows + row;
      if (head >= p.num_heads) break;  // rows only grow with it
      const float l = sm.row_sum[row];
      const float inv = inverse_row_sum(l);
      const float4 v = *reinterpret_cast<const float4*>(o_rows + row * Cfg::kOutStride + c4 * 4);
      reinterpret_cast<float4*>(o_base + std::int64_t(head) * kMlaLatentDim)[c4] = make_float4(v.x * inv, v.y * inv, v.z * inv, v.w * inv);
    }
    if (threadIdx.x < Cfg::kRows) {
      const int row = threadIdx.x, head = group * Cfg::kRows + row;
      if (head < p.num_heads) {
        const float l = sm.row_sum[row];
        // Empty rows: +inf as a final LSE (docs/mla.md §9), -inf as a partial one (weight 0 in the combine).
        const float lse = l > 0.f ? (sm.row_max[row] + log2f(l)) * 0.6931471805599453f : (is_split ? -INFINITY : INFINITY);
        lse_base[head] = lse;
      }
    }
    device::mark(wait, device::Mark::kItemEnd, tile);  // (thread 0's stores issued)
    if constexpr (kFusedCombine)
      if (is_split) fused_arrive(fused_counter(p, req, group));
  }
}

// One tile: every (request, page range) of part tile / groups, heads of group tile % groups.
// kFusedCombine (the op's shape only): the tiles of a split request merge its partials themselves
// (fused_pair_merge or fused_combine; needs p.counters and all tiles co-resident, which the
// launcher guarantees). The body waits before the tile unless p.plan_settled; then the tile waits
// itself (wait(), the body's policy), after starting its settled first pages.
template <class Cfg, SplitKvVariant kVariant = SplitKvVariant::kOp, bool kFusedCombine = false, class Wait>
__device__ inline void mla_splitkv_tile(const MlaAttentionParams& p, int tile, char* smem_base, PageRing& st,
                                        Wait& wait) {
  static_assert(!kFusedCombine || std::is_same_v<Cfg, SplitKvConfig>, "the fused combine runs in the op's shape");
  const int groups = head_groups<Cfg>(p.num_heads);
  const int part = tile / groups, group = tile % groups;
  const MlaPartPlan& plan = p.part_plans[part];
  const int begin_req = plan.begin_req;
  if (begin_req < 0) return;
  device::mark(wait, device::Mark::kItemBegin, tile);
  RequestPages<Cfg> started{};
  if (p.plan_settled) {
    started = start_settled_pages<Cfg>(p, plan, smem_base, st);
    device::mark(wait, device::Mark::kStreamReady, -1);  // the settled pages' copies are issued
    wait();
  }
  // Read once, block-uniform: split-KV itself may OR in kMlaErrorPageId while other tiles run (or
  // this tile's thread 0 just did, in start_settled_pages), and the fused tiles must all keep the
  // counter protocol whatever they see.
  const bool flagged = __syncthreads_or(step_flagged(p.error_flag));
  if (flagged && p.plan_settled) drain_pages<Cfg>(st, SplitKvSmem<Cfg>(smem_base).page);  // no copy lands in reused or freed memory
  if (flagged && !kFusedCombine) return;
  const int end_req = plan.end_req;
  const bool first_split = plan.first_is_split != 0;
  const bool last_split = plan.last_is_split != 0 && end_req != begin_req;
  // A split request's role in the fused combine: a pair's split 0 merges it in its epilogue, any
  // other piece arrives (and, for more than two splits, merges a slice at the tile's end).
  const bool first_owner = first_split && plan.begin_split == 0 && fused_pair(p, begin_req);
  const bool last_owner = last_split && fused_pair(p, end_req);  // an end request's piece is its split 0
  if (flagged) {  // (fused only) keep the counter protocol; nothing is computed or written
    if (first_split) {
      if (first_owner) fused_pair_skip(fused_counter(p, begin_req, group));
      else fused_arrive(fused_counter(p, begin_req, group));
    }
    if (last_split) {
      if (last_owner) fused_pair_skip(fused_counter(p, end_req, group));
      else fused_arrive(fused_counter(p, end_req, group));
    }
  } else {
    splitkv_part<Cfg, kVariant, kFusedCombine>(p, group, plan, smem_base, st, p.plan_settled, started, wait, tile);
  }
  if constexpr (kFusedCombine) {
    // All arrivals of this tile precede its waits, so no tile waits on one that waits on it.
    __syncthreads();  // the page slots are free (every copy of every request was awaited)
    char* slots = reinterpret_cast<char*>(SplitKvSmem<Cfg>(smem_base).page);
    // The last request first: its other parts ran it at their start, so its counter is complete,
    // while this part's first request waits for the part before, which ends about now.
    if (last_split && !fused_pair(p, end_req)) fused_combine(p, end_req, group, 0, !flagged, fused_counter(p, end_req, group), slots);
    if (first_split && !fused_pair(p, begin_req))
      fused_combine(p, begin_req, group, plan.begin_split, !flagged, fused_counter(p, begin_req, group), slots);
  }
}

// The split-KV body (common/body.cuh): the page slots' barriers, then every tile of the range;
// `pages` is the page pool's tensor map (a kernel parameter, or the megakernel's table in global
// memory). With a settled plan each tile starts its first pages before it waits. Cfg: the tile's
// shape (mla_splitkv_layout.cuh; the tiles are num_parts x head_groups<Cfg>).
template <SplitKvVariant kVariant = SplitKvVariant::kOp, bool kFusedCombine = false, class Cfg = SplitKvConfig, class Range,
          class Wait>
__device__ inline void mla_splitkv_body(const MlaAttentionParams& p, const CUtensorMap* pages, const Range& r, char* smem,
                                        Wait& wait) {
  PageRing slots = page_ring_init<Cfg>(pages, smem);
  if (!p.plan_settled) wait();
  const int tiles = p.num_parts * head_groups<Cfg>(p.num_heads);
  for (int tile = r.first(); tile < tiles; tile += r.stride()) {
    mla_splitkv_tile<Cfg, kVariant, kFusedCombine>(p, tile, smem, slots, wait);
    encore::device::fence_proxy_async();  // this tile's generic writes to the slots, before the next tile's copies
    __syncthreads();
  }
  if constexpr (Wait::kSharedMemoryReused)
    if (threadIdx.x == 0) encore::device::barrier_inval(slots.full, Cfg::kRingSlots);
}

}  // namespace encore::mla
