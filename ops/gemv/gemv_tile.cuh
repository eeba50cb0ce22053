// Device body of the Q4_K GEMV family: one tile = 8 warps x W output rows of one or two matrices
// (gate/up share the activations) for all tokens of the step.
//
// Weights: each warp streams its W rows through its own ring of `slots` shared-memory
// buffers, one bulk copy per (matrix, row) and slot of `slot_blocks` K blocks, completion on one
// mbarrier per buffer. The ring runs ahead across the tiles a block executes (WeightPipe), so the
// first slots of the next tile are in flight while this one computes; bytes in flight cost no
// registers. The copies of a block's first slots are issued before the PDL wait.
//
// Math: the 8 four-lane groups of a warp are G row groups x (8 / G) K slices; group g owns the
// RL = W / G rows g % G + G * i (i < RL) and the slot's blocks g / G, g / G + 8 / G, ... Lane p
// of a group reads 64 weights per block and row (q4k_stream.cuh): one scale/min decode per 64
// weights, each activation load serves RL rows (RL > 1 for several tokens).
// Row sums are fixed-order shuffle butterflies: the result never depends on the grid or the block
// that runs a tile.
//
// Activations are quantised to int8 (activation_q8.cuh) into shared memory, `chunk_blocks` K
// blocks at a time; when one chunk holds all of K, a block that runs several tiles keeps them.
//
// From 5 tokens the launcher picks the int8 tensor-core body instead (gemv_tile_mma, q4k_mma.cuh):
// the same weight rings and activations, one mma.sync.m16n8k32 per sub-block and 8 tokens. The
// fp16 tensor-core body (gemv_tile_mma_f16, q4k_mma_f16.cuh; GemvCore::kMmaF16) shares its row
// groups and rings but quantises the activations to scaled fp16 (activation_f16.cuh) and applies
// the scales once per block instead of once per sub-block.
#pragma once

#include <cstdint>

#include <encore/q4k.h>

#include "common/body.cuh"
#include "common/block.h"
#include "common/warp.cuh"
#include "common/smem_allocator.cuh"
#include "q4k/activation_q8.cuh"
#include "q4k/q4k_mma.cuh"
#include "q4k/q4k_mma_f16.cuh"
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
  int rows_per_warp;          // W = row_groups * RL (RL = rows_per_group of the instantiation)
  int row_groups;             // G: 1, 2, 4 or 8 (8 / G groups split K)
  int slot_blocks;           // K blocks per ring slot: slot_blocks_for(G, RL, matrices)
  int slots;                 // ring depth per warp, 2..kMaxSlots (launchers plan up to kLaunchMaxSlots)
  int chunk_blocks;           // K blocks quantised per shared-memory pass (k_blocks, or a multiple of slot_blocks)
  bool mma;                   // a tensor-core core: row groups of kMmaTileRows rows, K split over the warps
  bool mma_f16;               // with mma: the fp16 core (fp16 activations, sc * q weights), else int8
  int mma_part_bits;          // mma cores: log2 of the warps per row group (K parts: 1, 2, 4 or 8)
};

inline constexpr int kMaxTokens = 16;
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
    f16 = f16_format;
    if (f16) {
      f16_token_pitch = chunk_blocks * q4k::kF16ValueBlockBytes + q4k::kF16TokenPad;
      act = a.take<char>(std::size_t(ntok) * f16_token_pitch, 128);
      f16_sums = a.take<char>(std::size_t(chunk_blocks) * ntok * q4k::kF16SumsBytes);
      f16_scales = a.take<float>(std::size_t(chunk_blocks) * ntok);
    } else {
      act = a.take<char>(std::size_t(ntok) * chunk_blocks * kActStride);
    }
    ntok_ = ntok;
    block_ss = a.take<float>(std::size_t(ntok) * chunk_blocks);
    total_ss = a.take<float>(kMaxTokens);
    inv_rms = a.take<float>(kMaxTokens);
    // mma core: each warp's partial sums of a tile, [warp][matrix][token tile][element][lane].
    partials = p.mma ? a.take<float>(std::size_t(kWarpsPerBlock) * nmat * (ntok / 8) * 4 * 32) : nullptr;
    bytes = a.used();
  }
  float* partials;
  std::size_t bytes;
  // fp16 core: values [token][block] (token rows f16_token_pitch apart), sums and scales [block][token].
  bool f16 = false;
  int f16_token_pitch = 0, ntok_ = 0;
  char* f16_sums = nullptr;
  float* f16_scales = nullptr;
  __device__ char* act_block(int token, int j) const { return act + (std::size_t(token) * chunk_blocks + j) * kActStride; }
  __device__ char* f16_values(int token, int j) const {
    return act + std::size_t(token) * f16_token_pitch + std::size_t(j) * q4k::kF16ValueBlockBytes;
  }
  __device__ char* f16_sums_of(int token, int j) const {
    return f16_sums + (std::size_t(j) * ntok_ + token) * q4k::kF16SumsBytes;
  }
  __device__ float* f16_scale_of(int token, int j) const { return f16_scales + std::size_t(j) * ntok_ + token; }
};

// The per-warp weight ring. The producer cursor walks the same (tile, slot) sequence the block
// computes: tiles first_tile, first_tile + tile_stride, ... and ceil(k_blocks / slot_blocks)
// slots per tile. Values are warp-uniform.
struct WeightPipe {
  std::uint64_t* bars;
  char* ring;
  int slot_size;
  std::uint32_t consumed = 0, issued = 0;
  std::int64_t next_tile, tile_stride, tiles;
  int next_k_piece = 0;
};

// The state a block carries from one tile to the next.
struct TileState {
  WeightPipe pipe;
  bool act_cached = false;  // the activations of the previous tile are still in shared memory
};

namespace detail {

// Copies the producer's next slot into its ring buffer (nothing once the block's tiles are done).
// MMA: the mma core's pipe, where every warp streams its row group over its own K part.
template <int NMAT, bool MMA = false>
__device__ __forceinline__ void fill_next_slot(const GemvTileParams& p, WeightPipe& pipe, std::uint64_t policy) {
  if (pipe.next_tile >= pipe.tiles) return;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, R = p.rows_per_warp;
  const int k_begin = MMA ? mma_k_begin(p, warp) : 0, k_end = MMA ? mma_k_end(p, warp) : p.k_blocks;
  if (MMA && k_begin == k_end) return;
  const std::uint32_t slot = pipe.issued % std::uint32_t(p.slots);
  const int kb0 = k_begin + pipe.next_k_piece * p.slot_blocks;
  const int nb = min(p.slot_blocks, k_end - kb0);
  const std::int64_t row0 = MMA ? pipe.next_tile * tile_rows(p) + mma_row_group(p, warp) * kMmaTileRows
                                : pipe.next_tile * rows_per_tile(R) + warp * R;
  const std::int64_t left = p.n - row0;
  const int valid = left <= 0 ? 0 : left < R ? int(left) : R;
  const std::uint32_t bytes = std::uint32_t(nb) * q4k::kBlockBytes;
  if (lane == 0) device::barrier_arrive_expect(&pipe.bars[slot], std::uint32_t(NMAT * valid) * bytes);
  for (int c = lane; c < NMAT * R; c += 32) {
    const int m = c / R, r = c % R;
    if (r < valid)
      device::bulk_copy_to_shared(pipe.ring + slot * pipe.slot_size + c * q4k::slot_pitch(p.slot_blocks),
                                  p.mat[m] + (row0 + r) * p.row_bytes + std::int64_t(kb0) * q4k::kBlockBytes, bytes,
                                  &pipe.bars[slot], policy);
  }
  ++pipe.issued;
  if (k_begin + ++pipe.next_k_piece * p.slot_blocks >= k_end) {
    pipe.next_k_piece = 0;
    pipe.next_tile += pipe.tile_stride;
  }
}

}  // namespace detail

// Sets up the calling warp's ring (barriers, first `slots` copies) for tiles first_tile,
// first_tile + tile_stride, ... < tiles. Reads only weights: may run before the PDL wait.
template <int NMAT, bool MMA = false>
__device__ WeightPipe start_weight_pipe(const GemvTileParams& p, const GemvSmem& s, std::int64_t first_tile,
                                        std::int64_t tile_stride) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  WeightPipe pipe;
  pipe.bars = s.bars + warp * p.slots;
  pipe.ring = s.ring + std::size_t(warp) * s.ring_bytes_per_warp;
  pipe.slot_size = s.slot_size;
  pipe.next_tile = first_tile;
  pipe.tile_stride = tile_stride;
  pipe.tiles = num_tiles(p);
  if (lane == 0) {
    for (int i = 0; i < p.slots; ++i) device::barrier_init(&pipe.bars[i], 1);
    device::fence_barrier_init();
  }
  __syncwarp();
  const std::uint64_t policy = q4k::evict_first_policy();
  for (int i = 0; i < p.slots; ++i) detail::fill_next_slot<NMAT, MMA>(p, pipe, policy);
  return pipe;
}

namespace detail {

// Quantises K blocks [kb0, kb0 + nbc) of every active token into shared memory, and (with a norm)
// each block's sum(x^2). A warp takes (token, block) tasks round robin, four tasks' loads in flight
// at once so the prologue costs about one L2 round trip per four tasks. F16: the fp16 core's format.
template <bool F16 = false>
__device__ __forceinline__ void quantize_chunk(const GemvTileParams& p, int kb0, int nbc, const GemvSmem& s) {
  constexpr int kTasksInFlight = 4;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int tasks = p.batch * nbc;
  for (int base = warp; base < tasks; base += kWarpsPerBlock * kTasksInFlight) {
    float v[kTasksInFlight][8];
#pragma unroll
    for (int u = 0; u < kTasksInFlight; ++u) {
      const int task = base + u * kWarpsPerBlock;
      if (task >= tasks) break;
      const int t = task / nbc, j = task % nbc;
      const float4* src = reinterpret_cast<const float4*>(p.x + t * p.x_stride + std::int64_t(kb0 + j) * 256 + lane * 8);
      const float4 a = src[0], b = src[1];
      v[u][0] = a.x, v[u][1] = a.y, v[u][2] = a.z, v[u][3] = a.w, v[u][4] = b.x, v[u][5] = b.y, v[u][6] = b.z, v[u][7] = b.w;
    }
#pragma unroll
    for (int u = 0; u < kTasksInFlight; ++u) {
      const int task = base + u * kWarpsPerBlock;
      if (task >= tasks) break;
      const int t = task / nbc, j = task % nbc;
      if (p.gamma) {
        float ss = 0.f;
#pragma unroll
        for (int i = 0; i < 8; ++i) ss += v[u][i] * v[u][i];
        ss = device::warp_sum(ss);
        if (lane == 0) s.block_ss[t * p.chunk_blocks + j] = ss;
        const float4* g = reinterpret_cast<const float4*>(p.gamma + std::int64_t(kb0 + j) * 256 + lane * 8);
        const float4 ga = __ldg(g), gb = __ldg(g + 1);
        v[u][0] *= ga.x, v[u][1] *= ga.y, v[u][2] *= ga.z, v[u][3] *= ga.w;
        v[u][4] *= gb.x, v[u][5] *= gb.y, v[u][6] *= gb.z, v[u][7] *= gb.w;
      }
      if constexpr (F16)
        q4k::quantize_act_block_f16(v[u], s.f16_values(t, j), s.f16_sums_of(t, j), s.f16_scale_of(t, j));
      else
        q4k::quantize_act_block(v[u], s.act_block(t, j));
    }
  }
}

// After a chunk's prologue (and a barrier): fold its per-block sums into each token's total (a
// warp per token: lane-strided partial sums, then a fixed butterfly). After the last chunk: 1/rms.
__device__ __forceinline__ void accumulate_rms(const GemvTileParams& p, int kb0, int nbc, const GemvSmem& s) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int t = warp; t < p.batch; t += kWarpsPerBlock) {
    float part = 0.f;
    for (int j = lane; j < nbc; j += 32) part += s.block_ss[t * p.chunk_blocks + j];
    part = device::warp_sum(part);
    if (lane == 0) {
      const float total = (kb0 == 0 ? 0.f : s.total_ss[t]) + part;
      s.total_ss[t] = total;
      if (kb0 + nbc == p.k_blocks) s.inv_rms[t] = rsqrtf(total / float(p.k_blocks * 256) + p.eps);
    }
  }
}

// Writes output (row, token t) from the row's gate (or only) sum g and up sum u, before the RMS
// scale: the epilogue of every core.
__device__ __forceinline__ void store_output(const GemvTileParams& p, const GemvSmem& s, std::int64_t row, int t,
                                             float g, float u) {
  const float scale = p.gamma ? s.inv_rms[t] : 1.f;
  const std::int64_t at = t * p.out_stride + row;
  g *= scale;
  if (p.epilogue == Epilogue::kStore) {
    p.out[0][at] = p.residual ? g + p.residual[at] : g;
  } else {
    u *= scale;
    if (p.epilogue == Epilogue::kSiluMul) {
      p.out[0][at] = g / (1.f + expf(-g)) * u;
    } else {
      p.out[0][at] = g;
      p.out[1][at] = u;
    }
  }
}

// Tile 0 writes rmsnorm(x) * gamma when asked.
__device__ __forceinline__ void store_normalized(const GemvTileParams& p, const GemvSmem& s, std::int64_t tile) {
  if (!p.normalized || tile != 0) return;
  const std::int64_t k = std::int64_t(p.k_blocks) * 256;
  for (int t = 0; t < p.batch; ++t)
    for (std::int64_t j = threadIdx.x; j < k; j += kBlockThreads)
      p.normalized[t * k + j] = p.x[t * p.x_stride + j] * s.inv_rms[t] * p.gamma[j];
}

// Quantises chunk [kb0, kb0 + nbc) of the activations (and its RMS sums) unless they are cached.
template <bool F16 = false>
__device__ __forceinline__ void load_chunk(const GemvTileParams& p, int kb0, int nbc, const GemvSmem& s) {
  __syncthreads();  // the previous chunk's readers are done
  quantize_chunk<F16>(p, kb0, nbc, s);
  __syncthreads();
  if (p.gamma) {
    accumulate_rms(p, kb0, nbc, s);
    __syncthreads();
  }
}

// The mma core multiplies whole 8-token tiles: the activation slots of tokens batch..ntok-1 get
// zero codes and scales, so no product reads uninitialised shared memory (their outputs are never
// stored).
__device__ __forceinline__ void zero_missing_tokens(const GemvTileParams& p, int ntok, const GemvSmem& s) {
  const int vectors = (ntok - p.batch) * s.chunk_blocks * kActStride / 16;
  int4* first = reinterpret_cast<int4*>(s.act_block(p.batch, 0));
  for (int i = threadIdx.x; i < vectors; i += kBlockThreads) first[i] = make_int4(0, 0, 0, 0);
  __syncthreads();
}

// The same for the fp16 core's format: zero values, sums and scales for tokens batch..ntok-1.
__device__ __forceinline__ void zero_missing_tokens_f16(const GemvTileParams& p, int ntok, const GemvSmem& s) {
  const int value_vectors = (ntok - p.batch) * s.f16_token_pitch / 16;
  int4* first = reinterpret_cast<int4*>(s.f16_values(p.batch, 0));
  for (int i = threadIdx.x; i < value_vectors; i += kBlockThreads) first[i] = make_int4(0, 0, 0, 0);
  const int missing = ntok - p.batch, entries = s.chunk_blocks * missing;
  for (int i = threadIdx.x; i < entries; i += kBlockThreads) {
    const int token = p.batch + i % missing, j = i / missing;
    int4* sums = reinterpret_cast<int4*>(s.f16_sums_of(token, j));
    sums[0] = sums[1] = make_int4(0, 0, 0, 0);
    *s.f16_scale_of(token, j) = 0.f;
  }
  __syncthreads();
}

}  // namespace detail

// Runs one tile: the calling block's TileState must have been started for the sequence of tiles
// it runs, in that order. RL must equal p.rows_per_warp / p.row_groups.
template <int NTOK, int NMAT, int RL>
__device__ void gemv_tile(const GemvTileParams& p, std::int64_t tile, const GemvSmem& s, TileState& state) {
  WeightPipe& pipe = state.pipe;
  const int G = p.row_groups, slices = 8 / G, W = p.rows_per_warp;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int group = lane / 4, quad = lane % 4;
  const int my_g = group % G, slice = group / G;
  const std::int64_t row0 = tile * rows_per_tile(W) + warp * W;
  const bool single_chunk = p.chunk_blocks >= p.k_blocks;
  const bool quantize = !(single_chunk && state.act_cached);
  const int pitch = q4k::slot_pitch(p.slot_blocks);
  const std::uint64_t policy = q4k::evict_first_policy();
  const q4k::PairUnpack unpack = q4k::pair_unpack(quad);
  // Rows of this group that exist: i < live (rows my_g + G * i, i < RL).
  const std::int64_t left = p.n - row0 - my_g;
  const int live = left <= 0 ? 0 : left >= std::int64_t(G) * (RL - 1) + 1 ? RL : int((left + G - 1) / G);

  float acc[NMAT][RL][NTOK];
#pragma unroll
  for (int m = 0; m < NMAT; ++m)
#pragma unroll
    for (int i = 0; i < RL; ++i)
#pragma unroll
      for (int t = 0; t < NTOK; ++t) acc[m][i][t] = 0.f;

  for (int kb0 = 0; kb0 < p.k_blocks; kb0 += p.chunk_blocks) {
    const int nbc = min(p.chunk_blocks, p.k_blocks - kb0);
    if (quantize) detail::load_chunk(p, kb0, nbc, s);
    for (int ks0 = kb0; ks0 < kb0 + nbc; ks0 += p.slot_blocks) {
      const int nb = min(p.slot_blocks, p.k_blocks - ks0);
      const std::uint32_t slot = pipe.consumed % std::uint32_t(p.slots);
      device::barrier_wait(&pipe.bars[slot], (pipe.consumed / std::uint32_t(p.slots)) & 1u);
      const char* slot_data = pipe.ring + slot * pipe.slot_size + my_g * pitch;
#pragma unroll(RL == 1 ? 2 : 1)
      for (int jl = slice; jl < nb; jl += slices) {
        if (live == 0) break;
        q4k::QuadWeights w[NMAT][RL];
#pragma unroll
        for (int m = 0; m < NMAT; ++m)
#pragma unroll
          for (int i = 0; i < RL; ++i)
            if (i < live) w[m][i] = q4k::decode_quad(slot_data + (m * W + G * i) * pitch + jl * q4k::kBlockBytes, quad, unpack);
#pragma unroll
        for (int t = 0; t < NTOK; ++t) {
          if (t >= p.batch) break;
          const q4k::QuadActivations a = q4k::load_quad_activations(s.act_block(t, ks0 - kb0 + jl), quad);
#pragma unroll
          for (int m = 0; m < NMAT; ++m)
#pragma unroll
            for (int i = 0; i < RL; ++i)
              if (i < live) acc[m][i][t] += q4k::quad_dot(w[m][i], a);
        }
      }
      __syncwarp();  // every lane is done with the buffer before it is refilled
      ++pipe.consumed;
      detail::fill_next_slot<NMAT>(p, pipe, policy);
    }
  }
  state.act_cached = single_chunk;

  // Row sums: the 4 lanes of a group, then the 8 / G groups of the row (fixed butterfly order).
#pragma unroll
  for (int m = 0; m < NMAT; ++m)
#pragma unroll
    for (int i = 0; i < RL; ++i)
#pragma unroll
      for (int t = 0; t < NTOK; ++t) {
        float v = acc[m][i][t];
        v += __shfl_xor_sync(0xFFFFFFFFu, v, 1);
        v += __shfl_xor_sync(0xFFFFFFFFu, v, 2);
        for (int offset = 4 * G; offset < 32; offset <<= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, offset);
        acc[m][i][t] = v;
      }

  // The 32 / G lanes of a row store its tokens round robin.
  const int lanes_per_row = 32 / G, my_index = slice * 4 + quad;
#pragma unroll
  for (int i = 0; i < RL; ++i) {
    if (i >= live) break;
    const std::int64_t row = row0 + my_g + G * i;
#pragma unroll
    for (int t = 0; t < NTOK; ++t) {
      if (t >= p.batch) break;
      if (t % lanes_per_row != my_index) continue;
      detail::store_output(p, s, row, t, acc[0][i][t], acc[NMAT - 1][i][t]);
    }
  }
  detail::store_normalized(p, s, tile);
}

namespace detail {

// The mma cores' epilogue: lane (g, t) of warp w holds, per matrix and 8-token tile, element e =
// (row g + 8 (e / 2), token 2t + e % 2) of its row group's sum over its K part. The parts' sums
// meet in shared memory and are added in part order, then stored.
template <int NTOK, int NMAT>
__device__ __forceinline__ void store_mma_sums(const GemvTileParams& p, const GemvSmem& s, std::int64_t tile,
                                               const float (&acc)[NMAT][NTOK / 8][4], int parts) {
  constexpr int kTokenTiles = NTOK / 8, kRows = kMmaTileRows, kSums = NMAT * kTokenTiles * 4;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // The parts' partial sums, added in part order: [warp][sum][lane]. (A warp-local epilogue for one
  // part, without the block barriers, spilled 16 bytes in gemv_mma_kernel<16, 2>.)
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

}  // namespace detail

// The int8 tensor-core body (q4k_mma.cuh) for 5..16 tokens. A tile is kWarpsPerBlock >> mma_part_bits
// row groups of kMmaTileRows rows of each matrix; warp w streams the rows of its group
// (mma_row_group) over its K part (mma_k_begin / mma_k_end), and lane (g, t) holds rows g and g + 8
// and tokens 2t, 2t + 1 of every 8-token tile. The parts' partial sums meet in shared memory and are
// added in part order. Needs all of K's activations in one chunk. The K order of the sums differs
// from the dp4a body's (and between part counts), so they round differently.
template <int NTOK, int NMAT>
__device__ void gemv_tile_mma(const GemvTileParams& p, std::int64_t tile, const GemvSmem& s, TileState& state) {
  static_assert(NTOK % 8 == 0, "the mma core takes 8-token tiles");
  constexpr int kTokenTiles = NTOK / 8, kRows = kMmaTileRows;
  WeightPipe& pipe = state.pipe;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  // The dp4a core's padded pitch also serves the mma lanes (an unpadded one was no faster).
  const int pitch = q4k::slot_pitch(p.slot_blocks);
  const std::uint64_t policy = q4k::evict_first_policy();
  if (!state.act_cached) {
    detail::load_chunk(p, 0, p.k_blocks, s);
    detail::zero_missing_tokens(p, NTOK, s);
  }
  state.act_cached = true;

  float acc[NMAT][kTokenTiles][4];
#pragma unroll
  for (int m = 0; m < NMAT; ++m)
#pragma unroll
    for (int nt = 0; nt < kTokenTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[m][nt][e] = 0.f;

  const int parts = 1 << p.mma_part_bits, k_end = mma_k_end(p, warp);
  for (int ks0 = mma_k_begin(p, warp); ks0 < k_end; ks0 += p.slot_blocks) {
    const int nb = min(p.slot_blocks, k_end - ks0);
    const std::uint32_t slot = pipe.consumed % std::uint32_t(p.slots);
    device::barrier_wait(&pipe.bars[slot], (pipe.consumed / std::uint32_t(p.slots)) & 1u);
    const char* slot_data = pipe.ring + slot * pipe.slot_size;
    for (int jb = 0; jb < nb; ++jb) {
      const int kb = ks0 + jb;
#pragma unroll
      for (int m = 0; m < NMAT; ++m) {
        // This lane's rows (g, g + 8) of matrix m; it decodes their scale/min pair t, and the
        // lanes of its group share theirs by shuffles.
        const char* rows[2];
        q4k::SubBlockPair own[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          rows[r] = slot_data + (m * kRows + g + 8 * r) * pitch + jb * q4k::kBlockBytes;
          own[r] = q4k::decode_pair(*reinterpret_cast<const uint4*>(rows[r]), t);
        }
#pragma unroll 1
        for (int pr = 0; pr < 4; ++pr) {
          const uint2 w0 = *reinterpret_cast<const uint2*>(rows[0] + 16 + 32 * pr + 8 * t);
          const uint2 w1 = *reinterpret_cast<const uint2*>(rows[1] + 16 + 32 * pr + 8 * t);
          const q4k::PairFragments frag = q4k::pair_fragments(w0, w1);
          const q4k::SubBlockPair sp[2] = {q4k::shuffle_pair(own[0], 4 * g + pr),
                                                   q4k::shuffle_pair(own[1], 4 * g + pr)};
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
    }
    __syncwarp();  // every lane is done with the buffer before it is refilled
    ++pipe.consumed;
    detail::fill_next_slot<NMAT, true>(p, pipe, policy);
  }

  detail::store_mma_sums<NTOK, NMAT>(p, s, tile, acc, parts);
  detail::store_normalized(p, s, tile);
}

// The fp16 tensor-core body (q4k_mma_f16.cuh, docs/q4k.md §9.2) for 5..16 tokens: the int8 mma
// body's row groups, K parts, rings and epilogue; per K block, lane (g, t) dequantises its 32 code
// bytes of rows g and g + 8 into sc * q once for every token, runs 16 m16n8k16 steps per 8-token
// tile (two accumulator chains, one per nibble) and the min term's two m16n8k8 steps, then scales
// the block's sums once. Needs all of K's activations in one chunk.
template <int NTOK, int NMAT>
__device__ void gemv_tile_mma_f16(const GemvTileParams& p, std::int64_t tile, const GemvSmem& s, TileState& state) {
  static_assert(NTOK % 8 == 0, "the mma core takes 8-token tiles");
  constexpr int kTokenTiles = NTOK / 8, kRows = kMmaTileRows;
  WeightPipe& pipe = state.pipe;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int pitch = q4k::slot_pitch(p.slot_blocks);
  const std::uint64_t policy = q4k::evict_first_policy();
  if (!state.act_cached) {
    detail::load_chunk<true>(p, 0, p.k_blocks, s);
    detail::zero_missing_tokens_f16(p, NTOK, s);
  }
  state.act_cached = true;

  float acc[NMAT][kTokenTiles][4];
#pragma unroll
  for (int m = 0; m < NMAT; ++m)
#pragma unroll
    for (int nt = 0; nt < kTokenTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[m][nt][e] = 0.f;

  const int parts = 1 << p.mma_part_bits, k_end = mma_k_end(p, warp);
  for (int ks0 = mma_k_begin(p, warp); ks0 < k_end; ks0 += p.slot_blocks) {
    const int nb = min(p.slot_blocks, k_end - ks0);
    const std::uint32_t slot = pipe.consumed % std::uint32_t(p.slots);
    device::barrier_wait(&pipe.bars[slot], (pipe.consumed / std::uint32_t(p.slots)) & 1u);
    const char* slot_data = pipe.ring + slot * pipe.slot_size;
    for (int jb = 0; jb < nb; ++jb) {
      const int kb = ks0 + jb;
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
          rows[m][r] = slot_data + (m * kRows + g + 8 * r) * pitch + jb * q4k::kBlockBytes;
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
        const uint2 sm = *reinterpret_cast<const uint2*>(s.f16_sums_of(nt * 8 + g, kb) + 8 * t);
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
    }
    __syncwarp();  // every lane is done with the buffer before it is refilled
    ++pipe.consumed;
    detail::fill_next_slot<NMAT, true>(p, pipe, policy);
  }
  detail::store_mma_sums<NTOK, NMAT>(p, s, tile, acc, parts);
  detail::store_normalized(p, s, tile);
}

// The GEMV body (common/body.cuh): every warp's weight ring starts on the block's tiles (weights
// only), then the wait, the tiles, and (when another body follows) the ring's barriers are
// invalidated: every copy the ring issued was consumed. C: the core, whose plan p must be (the
// tensor-core cores take NTOK >= 8).
enum class Core { kDp4a, kMmaS8, kMmaF16 };
__host__ __device__ inline Core core_of(const GemvTileParams& p) {
  return !p.mma ? Core::kDp4a : p.mma_f16 ? Core::kMmaF16 : Core::kMmaS8;
}

template <int NTOK, int NMAT, Core C, class Range, class Wait>
__device__ void gemv_body(const GemvTileParams& p, const Range& r, char* smem, Wait& wait) {
  constexpr bool kMma = C != Core::kDp4a;
  const GemvSmem s(smem, p, NTOK, NMAT, C == Core::kMmaF16);
  const std::int64_t tiles = num_tiles(p);
  TileState state;
  state.pipe = start_weight_pipe<NMAT, kMma>(p, s, r.first(), r.stride());
  wait();
  for (std::int64_t tile = r.first(); tile < tiles; tile += r.stride()) {
    if constexpr (C == Core::kMmaF16)
      gemv_tile_mma_f16<NTOK, NMAT>(p, tile, s, state);
    else if constexpr (C == Core::kMmaS8)
      gemv_tile_mma<NTOK, NMAT>(p, tile, s, state);
    else
      gemv_tile<NTOK, NMAT, rows_per_group(NTOK, NMAT)>(p, tile, s, state);
  }
  if constexpr (Wait::kSharedMemoryReused) {
    __syncwarp();
    if (threadIdx.x % 32 == 0) device::barrier_inval(state.pipe.bars, p.slots);
  }
}

}  // namespace encore::gemv
