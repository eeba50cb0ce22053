// The GEMV's tensor-core cores (5..16 tokens; the fp16 one with one matrix also 17..32): row
// groups of 16 rows streamed over K parts, the int8 core (q4k_mma.cuh) and the fp16 core
// (q4k_mma_f16.cuh), and their shared epilogue.
#pragma once

#include <cstdint>

#include "gemv/gemv_activations.cuh"
#include "gemv/gemv_pipe.cuh"
#include "q4k/q4k_mma.cuh"
#include "q4k/q4k_mma_f16.cuh"

namespace encore::gemv {

namespace detail {

// The mma cores' epilogue: lane (g, t) of warp w holds, per matrix and 8-token tile, element e =
// (row g + 8 (e / 2), token 2t + e % 2) of its row group's sum over its K part. With one part the
// warp stores them; otherwise the parts' sums meet in shared memory and are added in part order,
// then stored.
template <int NTOK, int NMAT>
__device__ __forceinline__ void store_mma_sums(const GemvTileParams& p, const GemvSmem& s, std::int64_t tile,
                                               const float (&acc)[NMAT][NTOK / 8][4], int parts) {
  constexpr int kTokenTiles = NTOK / 8, kRows = kMmaTileRows, kSums = NMAT * kTokenTiles * 4;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (NMAT == 1 && parts == 1) {  // one matrix, one K part: the warp stores its rows' whole sums, no block barrier
    const std::int64_t row0 = tile * tile_rows(p) + warp * kRows + lane / 4;
#pragma unroll
    for (int nt = 0; nt < kTokenTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const std::int64_t row = row0 + 8 * (e / 2);
        const int token = nt * 8 + 2 * (lane % 4) + e % 2;
        if (row < p.n && token < p.batch) detail::store_output(p, s, row, token, acc[0][nt][e], acc[0][nt][e]);
      }
    return;
  }
  // The parts' partial sums, added in part order: [warp][sum][lane]. (The warp-local epilogue for one
  // part spills in gemv_mma_kernel<16, 2>, so gate/up keeps this one.)
  __syncthreads();  // the previous tile's readers of `partials` are done
  float* mine = s.partials + std::size_t(warp) * kSums * 32;
#pragma unroll
  for (int m = 0; m < NMAT; ++m)
#pragma unroll
    for (int nt = 0; nt < kTokenTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) mine[((m * kTokenTiles + nt) * 4 + e) * 32 + lane] = acc[m][nt][e];
  __syncthreads();
  // Item i: element e of token tile nt held by lane l of row group rg (row g + 8 (e / 2), token
  // 2 (l % 4) + e % 2 of the tile), every matrix.
  constexpr int kGroupItems = kTokenTiles * 4 * 32;
  for (int i = threadIdx.x; i < (kWarpsPerBlock / parts) * kGroupItems; i += kBlockThreads) {
    const int l = i % 32, e = (i / 32) % 4, nt = (i / (4 * 32)) % kTokenTiles, rg = i / kGroupItems;
    float sum[NMAT];
#pragma unroll
    for (int m = 0; m < NMAT; ++m) {
      sum[m] = 0.f;
#pragma unroll 4
      for (int q = 0; q < parts; ++q)  // several loads in flight (a full unroll spilled in gemv_mma_kernel<16, 2>)
        sum[m] += s.partials[(std::size_t(rg * parts + q) * kSums + (m * kTokenTiles + nt) * 4 + e) * 32 + l];
    }
    const std::int64_t row = tile * tile_rows(p) + rg * kRows + l / 4 + 8 * (e / 2);
    const int token = nt * 8 + 2 * (l % 4) + e % 2;
    if (row < p.n && token < p.batch) detail::store_output(p, s, row, token, sum[0], sum[NMAT - 1]);
  }
}


// One tile of an mma core: the activations once per block (F16: the fp16 core's format), then
// the warp's K part, block by block from its ring: block_math(acc, block, kb) with `block` the
// slot's first row's 144 bytes of K block kb (a row group's rows lie `pitch` apart), then the
// parts' sums and the stores.
template <int NTOK, int NMAT, bool F16, class BlockMath>
__device__ __forceinline__ void run_mma_tile(const GemvTileParams& p, std::int64_t tile, const GemvSmem& s, TileState& state,
                                             BlockMath&& block_math) {
  static_assert(NTOK % 8 == 0, "the mma cores take 8-token tiles");
  WeightPipe& pipe = state.pipe;
  const std::uint64_t policy = q4k::evict_first_policy();
  if (!state.act_cached && F16 && NMAT == 1 && p.act_image) {  // (the launcher sets an image for these only)
    copy_image(p, s);
  } else if (!state.act_cached) {
    load_chunk<NTOK, F16, kPrologueStaged<NTOK, NMAT, F16 ? Core::kMmaF16 : Core::kMmaS8>>(p, 0, p.k_blocks, s);
    if constexpr (F16)
      zero_missing_tokens_f16(p, NTOK, s);
    else
      zero_missing_tokens(p, NTOK, s);
  }
  state.act_cached = true;

  float acc[NMAT][NTOK / 8][4];
#pragma unroll
  for (int m = 0; m < NMAT; ++m)
#pragma unroll
    for (int nt = 0; nt < NTOK / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[m][nt][e] = 0.f;

  for (int ks0 = pipe.k_begin; ks0 < pipe.k_end; ks0 += p.slot_blocks) {
    const int nb = min(p.slot_blocks, pipe.k_end - ks0);
    const char* slot_data = pipe.wait_next();
    for (int jb = 0; jb < nb; ++jb) block_math(acc, slot_data + jb * q4k::kBlockBytes, ks0 + jb);
    __syncwarp();  // every lane is done with the buffer before it is refilled
    pipe.release();
    fill_next_slot<NMAT>(p, pipe, policy);
  }
  store_mma_sums<NTOK, NMAT>(p, s, tile, acc, 1 << p.mma_part_bits);
  store_normalized(p, s, tile);
}

}  // namespace detail

// The int8 tensor-core body (q4k_mma.cuh) for 5..16 tokens. A tile is kWarpsPerBlock >> mma_part_bits
// row groups of kMmaTileRows rows of each matrix; warp w streams the rows of its group
// (mma_row_group) over its K part (mma_k_begin / mma_k_end), and lane (g, t) holds rows g and g + 8
// and tokens 2t, 2t + 1 of every 8-token tile. The parts' partial sums meet in shared memory and are
// added in part order. Needs all of K's activations in one chunk. The K order of the sums differs
// from the dp4a body's (and between part counts), so they round differently.
template <int NTOK, int NMAT>
__device__ void gemv_tile_mma(const GemvTileParams& p, std::int64_t tile, const GemvSmem& s, TileState& state) {
  constexpr int kTokenTiles = NTOK / 8, kRows = kMmaTileRows;
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  // The dp4a core's padded pitch also serves the mma lanes (an unpadded one was no faster).
  const int pitch = q4k::slot_pitch(p.slot_blocks);
  detail::run_mma_tile<NTOK, NMAT, false>(p, tile, s, state, [&](float (&acc)[NMAT][kTokenTiles][4], const char* block, int kb) {
#pragma unroll
    for (int m = 0; m < NMAT; ++m) {
      // This lane's rows (g, g + 8) of matrix m; it decodes their scale/min pair t, and the
      // lanes of its group share theirs by shuffles.
      const char* rows[2];
      q4k::SubBlockPair own[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        rows[r] = block + (m * kRows + g + 8 * r) * pitch;
        own[r] = q4k::decode_pair(*reinterpret_cast<const uint4*>(rows[r]), t);
      }
#pragma unroll 1
      for (int pr = 0; pr < 4; ++pr) {
        const uint2 w0 = *reinterpret_cast<const uint2*>(rows[0] + 16 + 32 * pr + 8 * t);
        const uint2 w1 = *reinterpret_cast<const uint2*>(rows[1] + 16 + 32 * pr + 8 * t);
        const q4k::PairFragments frag = q4k::pair_fragments(w0, w1);
        const q4k::SubBlockPair sp[2] = {q4k::shuffle_pair(own[0], 4 * g + pr), q4k::shuffle_pair(own[1], 4 * g + pr)};
#pragma unroll
        for (int nt = 0; nt < kTokenTiles; ++nt) {
          const char* act = s.act_block(nt * 8 + g, kb);
          const uint2 b_lo = *reinterpret_cast<const uint2*>(act + 32 * pr + 8 * t);
          const uint2 b_hi = *reinterpret_cast<const uint2*>(act + 128 + 32 * pr + 8 * t);
          const q4k::PairActScales as[2] = {q4k::pair_act_scales(s.act_block(nt * 8 + 2 * t, kb), pr),
                                            q4k::pair_act_scales(s.act_block(nt * 8 + 2 * t + 1, kb), pr)};
          int c_lo[4], c_hi[4];
          q4k::mma_s8_16832(c_lo, frag.lo, b_lo.x, b_lo.y);
          q4k::mma_s8_16832(c_hi, frag.hi, b_hi.x, b_hi.y);
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[m][nt][e] += q4k::pair_term(sp[e / 2], as[e % 2], c_lo[e], c_hi[e]);
        }
      }
    }
  });
}

// The fp16 tensor-core body (q4k_mma_f16.cuh, docs/q4k.md §9.2) for 5..32 tokens: the int8 mma
// body's row groups, K parts, rings and epilogue; per K block, lane (g, t) dequantises its 32 code
// bytes of rows g and g + 8 into sc * q once for every token, runs 16 m16n8k16 steps per 8-token
// tile (two accumulator chains, one per nibble) and the min term's two m16n8k8 steps, then scales
// the block's sums once. Needs all of K's activations in one chunk.
template <int NTOK, int NMAT>
__device__ void gemv_tile_mma_f16(const GemvTileParams& p, std::int64_t tile, const GemvSmem& s, TileState& state) {
  constexpr int kTokenTiles = NTOK / 8, kRows = kMmaTileRows;
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int pitch = q4k::slot_pitch(p.slot_blocks);
  detail::run_mma_tile<NTOK, NMAT, true>(p, tile, s, state, [&](float (&acc)[NMAT][kTokenTiles][4], const char* block, int kb) {
    // This lane's rows (g, g + 8) of every matrix: codes, dequantisation constants, the min
    // term's A fragment {32 m_2t, 32 m_2t+1}.
    const char* rows[NMAT][2];
    q4k::RowDequant dq[NMAT][2];
    std::uint32_t a_min[NMAT][2];
    float d[NMAT][2], dmin[NMAT][2];
#pragma unroll
    for (int m = 0; m < NMAT; ++m)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        rows[m][r] = block + (m * kRows + g + 8 * r) * pitch;
        const q4k::PairCodes c = q4k::pair_codes(*reinterpret_cast<const uint4*>(rows[m][r]), t);
        dq[m][r] = q4k::row_dequant(c);
        a_min[m][r] = q4k::half2_bits(32.f * float(c.m & 0xFF), 32.f * float((c.m >> 8) & 0xFF));
        d[m][r] = c.d;
        dmin[m][r] = c.dmin;
      }
    float sums[NMAT][kTokenTiles][2][4], mins[NMAT][kTokenTiles][4];
#pragma unroll
    for (int m = 0; m < NMAT; ++m)
#pragma unroll
      for (int nt = 0; nt < kTokenTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) sums[m][nt][0][e] = sums[m][nt][1][e] = mins[m][nt][e] = 0.f;

    // Words u = 4 half + 0..3 of the lane's chunk: one 16-byte load per row and half.
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      uint4 words[NMAT][2];
#pragma unroll
      for (int m = 0; m < NMAT; ++m)
#pragma unroll
        for (int r = 0; r < 2; ++r)
          words[m][r] = *reinterpret_cast<const uint4*>(rows[m][r] + 16 + 32 * t + 16 * half);
#pragma unroll
      for (int uu = 0; uu < 4; ++uu) {
        const int u = 4 * half + uu;
        uint4 b[kTokenTiles];  // {h = 0: b0b1, b2b3; h = 1: b0b1, b2b3} of token nt * 8 + g
#pragma unroll
        for (int nt = 0; nt < kTokenTiles; ++nt)
          b[nt] = *reinterpret_cast<const uint4*>(s.f16_values(nt * 8 + g, kb) + q4k::f16_value_offset(u, t, 0));
#pragma unroll
        for (int m = 0; m < NMAT; ++m) {
          std::uint32_t f[2][2][2];  // [row][nibble][register]
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const uint4& w4 = words[m][r];
            const std::uint32_t w = uu == 0 ? w4.x : uu == 1 ? w4.y : uu == 2 ? w4.z : w4.w;
            q4k::dequant_word(w, dq[m][r], f[r]);
          }
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const std::uint32_t a[4] = {f[0][h][0], f[1][h][0], f[0][h][1], f[1][h][1]};
#pragma unroll
            for (int nt = 0; nt < kTokenTiles; ++nt)
              q4k::mma_f16_16816(sums[m][nt][h], a, h == 0 ? b[nt].x : b[nt].z, h == 0 ? b[nt].y : b[nt].w);
          }
        }
      }
    }
#pragma unroll
    for (int nt = 0; nt < kTokenTiles; ++nt) {
      const uint2 sm = *reinterpret_cast<const uint2*>(s.f16_sums_of(nt * 8 + g, kb) + q4k::f16_sum_offset(2 * t, 0));
      const float2 scale = *reinterpret_cast<const float2*>(s.f16_scale_of(nt * 8 + 2 * t, kb));
#pragma unroll
      for (int m = 0; m < NMAT; ++m) {
        q4k::mma_f16_1688(mins[m][nt], a_min[m], sm.x);
        q4k::mma_f16_1688(mins[m][nt], a_min[m], sm.y);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float dot = sums[m][nt][0][e] + sums[m][nt][1][e];
          acc[m][nt][e] += (e % 2 ? scale.y : scale.x) * (d[m][e / 2] * dot - dmin[m][e / 2] * mins[m][nt][e]);
        }
      }
    }
  });
}

}  // namespace encore::gemv
