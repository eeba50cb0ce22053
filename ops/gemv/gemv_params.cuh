// The Q4_K GEMV family's device-ready params, tile geometry and shared-memory layout, shared by
// its cores (gemv_tile.cuh describes them) and by the host planners (gemv.cu, the megakernel).
#pragma once

#include <cstdint>

#include <encore/ops/q4k_gemv.h>
#include <encore/q4k.h>

#include "common/block.h"
#include "common/smem_allocator.cuh"
#include "q4k/activation_f16.cuh"
#include "q4k/activation_q8.cuh"
#include "q4k/q4k_stream.cuh"

namespace encore::gemv {

enum class Epilogue : int {
  kStore,    // out0 = acc (+ residual)
  kSiluMul,  // out0 = silu(acc_gate) * acc_up
  kRaw,      // out0 = acc_gate, out1 = acc_up
};

// Device-ready arguments of one GEMV (built and validated by the host launchers).
struct GemvTileParams {
  const char* mat[2];         // Q4_K matrices [n][k_blocks] (mat[1] only for gate/up)
  std::int64_t row_bytes;     // k_blocks * 144
  const float* x;             // [batch][x_stride]
  std::int64_t x_stride;
  const float* gamma;         // [k] RMSNorm weight, or null (no norm)
  float eps;
  float* out[2];              // [batch][out_stride]
  std::int64_t out_stride;
  const float* residual;      // optional [batch][out_stride]
  float* normalized;          // optional [batch][k], written by tile 0
  Epilogue epilogue;
  std::int64_t n;             // rows
  int k_blocks;               // k / 256
  int batch;                  // active tokens (<= NTOK of the instantiation)
  int rows_per_warp;          // W = row_groups * RL (RL = rows_per_group of the instantiation); <= 32: lane r copies row r
  int row_groups;             // G: 1, 2, 4 or 8 (8 / G groups split K)
  int slot_blocks;           // K blocks per ring slot: slot_blocks_for(G, RL, matrices)
  int slots;                 // ring depth per warp, 2..kMaxSlots (launchers plan up to kLaunchMaxSlots)
  int chunk_blocks;           // K blocks quantised per shared-memory pass (k_blocks, or a multiple of slot_blocks)
  bool mma;                   // a tensor-core core: row groups of kMmaTileRows rows, K split over the warps
  bool mma_f16;               // with mma: the fp16 core (fp16 activations, sc * q weights), else int8
  int mma_part_bits;          // mma cores: log2 of the warps per row group (K parts: 1, 2, 4 or 8)
  // mma cores, optional: the block's activation region (GemvSmem act .. block_ss, at the offsets of
  // a block's shared memory) prepared once by the image kernel; copied instead of quantised.
  const char* act_image;
};

// Tokens of one launch: every core up to kMaxCoreTokens; the fp16 core with one matrix also takes
// a wide tier of kWideTokens (ops::kMaxGemvBatch), where all of K's activations fit one block.
inline constexpr int kMaxCoreTokens = 16;
inline constexpr int kWideTokens = 32;
static_assert(kWideTokens == ops::kMaxGemvBatch, "the public batch bound is the wide tier");
// Rows of an mma-core row group (the M of one m16n8k32). A tile is kWarpsPerBlock >> mma_part_bits
// row groups; the 1 << mma_part_bits warps of a group stream its rows, each over its own K part.
inline constexpr int kMmaTileRows = 16;
// Ring depth: the launchers plan up to 4 slots (two blocks per SM share the SM's shared memory);
// the megakernel, with one block per SM, deepens the same plan up to 8 (the depth changes no bits).
inline constexpr int kLaunchMaxSlots = 4;
inline constexpr int kMaxSlots = 8;
// (row, block) items per group and slot: one matrix 4, gate/up 2. Larger slots mean fewer, longer
// bulk copies; one matrix gains from them, gate/up does not (measurements: bench/notes/).
inline constexpr int kSlotRowBlocksOneMatrix = 4;
inline constexpr int kSlotRowBlocksGateUp = 2;
// Bytes between two tokens' / blocks' activations: 16 more than a block, so the two groups of a
// quarter warp that read neighbouring blocks (G = 1) hit different banks.
inline constexpr int kActStride = q4k::kActBlockBytes + 16;
static_assert(kActStride % 16 == 0, "activation slots are cleared and read in 16-byte vectors");

__host__ __device__ constexpr int rows_per_tile(int rows_per_warp) { return kWarpsPerBlock * rows_per_warp; }
__host__ __device__ inline std::int64_t tile_rows(const GemvTileParams& p) {
  return p.mma ? kMmaTileRows * (kWarpsPerBlock >> p.mma_part_bits) : rows_per_tile(p.rows_per_warp);
}
__host__ __device__ inline std::int64_t num_tiles(const GemvTileParams& p) { return (p.n + tile_rows(p) - 1) / tile_rows(p); }
// mma core: warp w streams row group w >> mma_part_bits over K part w & (parts - 1), K blocks
// [mma_k_begin, mma_k_end): contiguous, sizes differing by at most one (shifts: parts are powers of 2).
__host__ __device__ inline int mma_row_group(const GemvTileParams& p, int warp) { return warp >> p.mma_part_bits; }
__host__ __device__ inline int mma_k_begin(const GemvTileParams& p, int warp) {
  return (p.k_blocks * (warp & ((1 << p.mma_part_bits) - 1))) >> p.mma_part_bits;
}
__host__ __device__ inline int mma_k_end(const GemvTileParams& p, int warp) {
  return (p.k_blocks * ((warp & ((1 << p.mma_part_bits) - 1)) + 1)) >> p.mma_part_bits;
}
// Rows per group: the activations of one load serve this many rows. Only 4 tokens of one matrix
// use 2: more rows per group need up to 255 registers and a coarser K split (bench/notes/).
__host__ __device__ constexpr int rows_per_group(int ntok, int nmat) { return ntok == 4 && nmat == 1 ? 2 : 1; }
__host__ __device__ constexpr int slot_blocks_for(int row_groups, int rows_per_group, int nmat) {
  const int items = nmat == 1 ? kSlotRowBlocksOneMatrix : kSlotRowBlocksGateUp;
  return (items / rows_per_group > 0 ? items / rows_per_group : 1) * 8 / row_groups;
}
__host__ __device__ constexpr int slot_bytes(int nmat, int rows_per_warp, int slot_blocks) {
  return nmat * rows_per_warp * q4k::slot_pitch(slot_blocks);
}

// Shared memory of a block: barriers [warps][slots] | weight rings [warps][slots][slot]
// | activations [ntok][chunk_blocks] | sum(x^2) per (token, block) | running sum per token | 1/rms.
struct GemvSmem {
  std::uint64_t* bars;
  char* ring;
  char* act;
  float* block_ss;
  float* total_ss;
  float* inv_rms;
  int chunk_blocks, ring_bytes_per_warp, slot_size;

  // f16: the fp16 core's activation format (p.mma && p.mma_f16); the bodies pass it as a constant.
  __host__ __device__ GemvSmem(char* base, const GemvTileParams& p, int ntok, int nmat)
      : GemvSmem(base, p, ntok, nmat, p.mma && p.mma_f16) {}
  __host__ __device__ GemvSmem(char* base, const GemvTileParams& p, int ntok, int nmat, bool f16_format) {
    device::SmemAllocator a(base);
    bars = a.take<std::uint64_t>(kWarpsPerBlock * p.slots);
    slot_size = slot_bytes(nmat, p.rows_per_warp, p.slot_blocks);
    ring_bytes_per_warp = p.slots * slot_size;
    ring = a.take<char>(std::size_t(kWarpsPerBlock) * ring_bytes_per_warp);
    chunk_blocks = p.chunk_blocks;
    tokens = ntok;
    if (f16_format) {
      f16_token_pitch = chunk_blocks * q4k::kF16ValueBlockBytes + q4k::kF16TokenPad;
      act = a.take<char>(std::size_t(ntok) * f16_token_pitch, 128);
      f16_sums = a.take<char>(std::size_t(chunk_blocks) * ntok * q4k::kF16SumsBytes);
      f16_scales = a.take<float>(std::size_t(chunk_blocks) * ntok);
    } else {
      act = a.take<char>(std::size_t(ntok) * chunk_blocks * kActStride);
    }
    block_ss = a.take<float>(std::size_t(ntok) * chunk_blocks);
    total_ss = a.take<float>(ntok);
    inv_rms = a.take<float>(ntok);
    // mma core: each warp's partial sums of a tile, [warp][matrix][token tile][element][lane].
    partials = p.mma ? a.take<float>(std::size_t(kWarpsPerBlock) * nmat * (ntok / 8) * 4 * 32) : nullptr;
    bytes = a.used();
  }
  float* partials;
  std::size_t bytes;
  // fp16 core: values [token][block] (token rows f16_token_pitch apart), sums and scales [block][token].
  int f16_token_pitch = 0, tokens = 0;  // tokens: the body's tier (NTOK)
  char* f16_sums = nullptr;
  float* f16_scales = nullptr;
  __device__ char* act_block(int token, int j) const { return act + (std::size_t(token) * chunk_blocks + j) * kActStride; }
  __host__ __device__ char* f16_values(int token, int j) const {
    return act + std::size_t(token) * f16_token_pitch + std::size_t(j) * q4k::kF16ValueBlockBytes;
  }
  __host__ __device__ char* f16_sums_of(int token, int j) const {
    return f16_sums + (std::size_t(j) * tokens + token) * q4k::kF16SumsBytes;
  }
  __device__ float* f16_scale_of(int token, int j) const { return f16_scales + std::size_t(j) * tokens + token; }
};


// The dot-product core a plan runs.
enum class Core { kDp4a, kMmaS8, kMmaF16 };

// Blocks per SM a standalone kernel's registers are bounded for. dp4a bodies with up to 4
// accumulators per lane fit two (when shared memory allows); the others need the registers
// (several rows per group). The fp16 core's accumulators need more than half the register file
// from 16 (token, matrix) pairs; at that size its activations leave room for one block anyway.
template <int NTOK, int NMAT, Core C>
inline constexpr int kMinBlocksPerSm = C == Core::kDp4a ? (NTOK * NMAT * rows_per_group(NTOK, NMAT) >= 8 ? 1 : 2)
                                       : C == Core::kMmaF16 && NTOK * NMAT >= 16 ? 1
                                                                                 : 2;
// Whether the activation prologue stages its tasks' chains (detail::quantize_chunk): from two
// tokens where the registers are not bounded for two blocks per SM (gamma for four tasks spilled
// there).
template <int NTOK, int NMAT, Core C>
inline constexpr bool kPrologueStaged = NTOK > 1 && kMinBlocksPerSm<NTOK, NMAT, C> == 1;
__host__ __device__ inline Core core_of(const GemvTileParams& p) {
  return !p.mma ? Core::kDp4a : p.mma_f16 ? Core::kMmaF16 : Core::kMmaS8;
}

}  // namespace encore::gemv
