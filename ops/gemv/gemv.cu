// Standalone kernels and validating launchers of the Q4_K GEMV family.
#include <encore/ops/q4k_gemv.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "common/cuda_check.h"
#include "common/block.h"
#include "common/launch.h"
#include "gemv/gemv_plan.h"
#include "gemv/gemv_tile.cuh"

namespace encore::ops {
namespace {

using gemv::GemvTileParams;

// Dynamic shared memory a block may use to fit two (or one) blocks per SM on sm_90.
constexpr std::size_t kSmemTwoPerSm = 113 * 1024;
constexpr std::size_t kSmemOnePerSm = 227 * 1024;

template <int NTOK, int NMAT>
__global__ void __launch_bounds__(kBlockThreads, gemv::kMinBlocksPerSm<NTOK, NMAT, gemv::Core::kDp4a>)
    gemv_kernel(const __grid_constant__ GemvTileParams p) {
  extern __shared__ __align__(16) char smem[];
  // The first `slots` weight copies of every warp are in flight before the wait for the
  // upstream kernel (weights never depend on it); the ring is the prefetch.
  device::PdlWait wait;
  gemv::gemv_body<NTOK, NMAT, gemv::Core::kDp4a>(p, device::GridRange{}, smem, wait);
}

// The tensor-core cores (8 or 16 tokens; the fp16 one with one matrix also 32): row groups of
// kMmaTileRows rows, each group's K split over its warps.
template <int NTOK, int NMAT, gemv::Core C>
__global__ void __launch_bounds__(kBlockThreads, gemv::kMinBlocksPerSm<NTOK, NMAT, C>) gemv_mma_kernel(const __grid_constant__ GemvTileParams p) {
  extern __shared__ __align__(16) char smem[];
  device::PdlWait wait;
  gemv::gemv_body<NTOK, NMAT, C>(p, device::GridRange{}, smem, wait);
}

// The token-count tier a batch runs in: the kernels are instantiated for 1, 2, 4, 8 and 16 tokens,
// and the fp16 core with one matrix for 32 (kWideTokens).
constexpr int token_tier(int batch) {
  return batch <= 1 ? 1 : batch <= 2 ? 2 : batch <= 4 ? 4 : batch <= 8 ? 8 : batch <= 16 ? 16 : gemv::kWideTokens;
}

template <class F>
Status dispatch_tokens(int batch, F&& f) {
  switch (token_tier(batch)) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 4: return f(std::integral_constant<int, 4>{});
    case 8: return f(std::integral_constant<int, 8>{});
    case 16: return f(std::integral_constant<int, 16>{});
    default: return f(std::integral_constant<int, gemv::kWideTokens>{});
  }
}

std::size_t smem_bytes(const GemvTileParams& p, int ntok, int nmat) { return gemv::GemvSmem(nullptr, p, ntok, nmat).bytes; }

// Ring depth and activation chunk for the row split already set in p; returns the blocks per SM
// the shared memory allows (2 or 1). Prefers all of K in one chunk (quantised once per block),
// then two blocks per SM, then a deeper ring.
int plan_memory(GemvTileParams& p, int ntok, int nmat) {
  p.chunk_blocks = p.k_blocks;
  for (int blocks = 2; blocks >= 1; --blocks)
    for (int slots = gemv::kLaunchMaxSlots; slots >= 2; --slots) {
      p.slots = slots;
      if (smem_bytes(p, ntok, nmat) <= (blocks == 2 ? kSmemTwoPerSm : kSmemOnePerSm)) return blocks;
    }
  // Activations in chunks of whole slots, as many as fit beside the deepest ring that leaves room.
  for (int slots = gemv::kLaunchMaxSlots; slots >= 2; --slots) {
    p.slots = slots;
    p.chunk_blocks = 0;
    const std::size_t fixed = smem_bytes(p, ntok, nmat);
    const std::size_t per_block = std::size_t(ntok) * (gemv::kActStride + sizeof(float));
    const int fit = fixed < kSmemOnePerSm ? int((kSmemOnePerSm - fixed - 64) / per_block) : 0;
    if (fit >= p.slot_blocks) {
      p.chunk_blocks = fit / p.slot_blocks * p.slot_blocks;
      return 1;
    }
  }
  p.chunk_blocks = p.slot_blocks;  // unreachable for kMaxCoreTokens tokens; the launcher checks the size
  return 1;
}

// Relative time of one warp step (8 groups x one block x RL rows, all tokens) on an SM: issue
// slots over 4 schedulers or shared-memory wavefronts, whichever binds. From the core's SASS: ~68
// instructions per block row (loads, scale decode, nibbles) and 6 + 26 RL per token (activation
// loads, dp4a, scaling); weights cost 9 wavefronts per row, activations 6 loads per token whose
// wavefronts grow as fewer groups share a block (G = 1: 4, G = 2: 2, G >= 4: 1).
double step_cost(int row_groups, int ntok, int rl) {
  const double issue = (rl * 68.0 + ntok * (6.0 + rl * 26.0)) / 4;
  const int act_wavefronts = row_groups >= 4 ? 1 : 4 / row_groups;
  const double smem = rl * 9.0 + ntok * 6.0 * act_wavefronts;
  return std::max(issue, smem);
}

// Row groups G: the G whose busiest SM has the least work (rounds x blocks on it x steps per
// tile x step cost). Ties go to the larger G (fewer prologues, shared activation reads), except
// for long rows (>= 32 blocks), where more tiles keep two blocks per SM streaming.
void plan(GemvTileParams& p, int ntok, int nmat, int sms) {
  const int rl = gemv::rows_per_group(ntok, nmat);
  double best_cost = -1;
  GemvTileParams best = p;
  for (int groups : {1, 2, 4, 8}) {
    GemvTileParams q = p;
    q.row_groups = groups;
    q.rows_per_warp = groups * rl;
    q.slot_blocks = gemv::slot_blocks_for(groups, rl, nmat);
    int per_sm = plan_memory(q, ntok, nmat);
    // Long slots (G = 1: 32 blocks at 4 items) can leave no room for one slot's activations of
    // 16 tokens: then the candidate takes the short slots of gate/up.
    if (smem_bytes(q, ntok, nmat) > kSmemOnePerSm) {
      q.slot_blocks = gemv::slot_blocks_for(groups, rl, 2);
      per_sm = plan_memory(q, ntok, nmat);
    }
    const std::int64_t tiles = gemv::num_tiles(q);
    const std::int64_t grid = std::min<std::int64_t>(tiles, std::int64_t(per_sm) * sms);
    const int slices = 8 / groups;
    const double cost = double((tiles + grid - 1) / grid * ((grid + sms - 1) / sms) * ((p.k_blocks + slices - 1) / slices)) *
                        step_cost(groups, ntok, rl);
    const bool tie = best_cost >= 0 && std::fabs(cost - best_cost) <= 1e-9 * cost;
    if (best_cost < 0 || (!tie && cost < best_cost) || (tie && p.k_blocks < 32)) best_cost = cost, best = q;
  }
  p = best;
}

// The mma core's plan: row groups of kMmaTileRows rows, every warp streaming its group's rows over
// its K part in slots of kMmaSlotBlocks blocks; all of K's activations must fit in one chunk
// (false if they do not). The K parts per group (1, 2, 4 or 8; `k_parts` 0 = chosen here) trade
// balance between the warps of a group (K = 2304 is 9 blocks: 8 parts leave one warp two blocks
// and seven one) against tiles for the SMs (1 part: 128-row tiles), by mma_cost. With two blocks
// per SM (8 tokens) the cost model misjudges short grids, so there fewer than 8 parts only where
// every block still gets kMmaMinRounds tiles; with one block per SM (16 tokens) the cost model's
// choice is taken (both measured: bench/notes/).
constexpr int kMmaSlotBlocks = 2;
constexpr double kMmaReduceSteps = 0.5;  // the cross-part reduction, in K-block steps
constexpr int kMmaMinRounds = 4;

// Steps of the busiest SM: rounds of tiles x blocks per SM x K blocks of the longest part.
double mma_cost(const GemvTileParams& q, int per_sm, int sms) {
  const std::int64_t tiles = gemv::num_tiles(q);
  const std::int64_t grid = std::max<std::int64_t>(1, std::min<std::int64_t>(tiles, std::int64_t(per_sm) * sms));
  const int parts = 1 << q.mma_part_bits, longest = (q.k_blocks + parts - 1) / parts;
  return double((tiles + grid - 1) / grid * ((grid + sms - 1) / sms)) * (longest + (parts > 1 ? kMmaReduceSteps : 0.0));
}

int log2_parts(int parts) { return parts >= 8 ? 3 : parts >= 4 ? 2 : parts >= 2 ? 1 : 0; }

bool plan_mma(GemvTileParams& p, int ntok, int nmat, int sms, int k_parts, bool f16) {
  GemvTileParams q = p;
  q.mma = true;
  q.mma_f16 = f16;
  q.rows_per_warp = gemv::kMmaTileRows;
  q.row_groups = 8;
  q.mma_part_bits = log2_parts(kWarpsPerBlock);
  // The fp16 core's activations (2 bytes a value) may leave room only for one-block slots.
  int per_sm = 0;
  bool fits = false;
  for (int slot_blocks = kMmaSlotBlocks; slot_blocks >= (f16 ? 1 : kMmaSlotBlocks) && !fits; --slot_blocks) {
    q.slot_blocks = slot_blocks;
    per_sm = plan_memory(q, ntok, nmat);
    fits = q.chunk_blocks >= q.k_blocks && smem_bytes(q, ntok, nmat) <= kSmemOnePerSm;
  }
  if (!fits) return false;
  if (k_parts > 0) {
    q.mma_part_bits = log2_parts(k_parts);
  } else {
    double best = -1;
    int best_bits = q.mma_part_bits;
    for (int bits = q.mma_part_bits; bits >= 0; --bits) {  // ties keep more parts (more tiles)
      q.mma_part_bits = bits;
      if (per_sm > 1 && bits < 3 && gemv::num_tiles(q) < std::int64_t(kMmaMinRounds) * per_sm * sms) break;
      const double cost = mma_cost(q, per_sm, sms);
      if (best < 0 || cost < best - 1e-9) best = cost, best_bits = bits;
    }
    q.mma_part_bits = best_bits;
  }
  p = q;
  return true;
}

// Whether a launch asking for `core` may take the wide tier (above kMaxCoreTokens tokens: the fp16
// core only).
bool wide_tier_core(GemvCore core) { return core == GemvCore::kAuto || core == GemvCore::kMmaF16; }

// Whether a tensor-core core runs ntok tokens (their 8 / 16 tiers, the fp16 one's 32), if its plan
// fits; sets p's plan then. Asked for, the named core; by default from kGemvMmaMinBatch tokens, the
// fp16 one (faster on every Kimi shape at 8 and 16 tokens: docs/q4k.md §9.3), else the int8 one
// where fp16's does not fit.
bool plan_mma_if_chosen(GemvTileParams& p, int ntok, int nmat, const GemvLaunch& launch, int sms) {
  if (ntok < 8) return false;
  const int parts = launch.mma_k_parts;
  if (ntok > gemv::kMaxCoreTokens)  // (the wide tier: the fp16 core with one matrix only)
    return nmat == 1 && wide_tier_core(launch.core) && plan_mma(p, ntok, nmat, sms, parts, true);
  switch (launch.core) {
    case GemvCore::kMmaF16: return plan_mma(p, ntok, nmat, sms, parts, true);
    case GemvCore::kMma: return plan_mma(p, ntok, nmat, sms, parts, false);
    case GemvCore::kAuto:
      return p.batch >= kGemvMmaMinBatch && (plan_mma(p, ntok, nmat, sms, parts, true) || plan_mma(p, ntok, nmat, sms, parts, false));
    default: return false;
  }
}

// The device-dependent plan (row split, slots) of p for ntok tokens and its shared memory.
// Validation runs it too, so a shape the device cannot hold fails before any stage launches.
Status plan_launch(GemvTileParams& p, int ntok, int nmat, std::size_t& smem, const GemvLaunch& launch, int sms) {
  if (!plan_mma_if_chosen(p, ntok, nmat, launch, sms)) {
    ENCORE_REQUIRE(ntok <= gemv::kMaxCoreTokens, StatusCode::kUnsupported, "q4k gemv: batch = ", p.batch, " (above ",
                   gemv::kMaxCoreTokens, ") runs on the fp16 core with one matrix only, where all of K's activations fit (k = ",
                   p.k_blocks * 256, ", matrices = ", nmat, ": q4k_gemv_max_batch)");
    plan(p, ntok, nmat, sms);
  }
  smem = smem_bytes(p, ntok, nmat);
  ENCORE_REQUIRE(smem <= kSmemOnePerSm, StatusCode::kUnsupported, "q4k gemv: n = ", p.n, ", k = ", p.k_blocks * 256,
                 ", batch = ", p.batch, ": no shared-memory plan fits (", smem, " bytes)");
  return {};
}

Status check_options(const GemvLaunch& options) {
  ENCORE_REQUIRE(options.core == GemvCore::kAuto || options.core == GemvCore::kDp4a || options.core == GemvCore::kMma ||
                     options.core == GemvCore::kMmaF16,
                 StatusCode::kInvalidArgument, "q4k gemv: GemvLaunch::core must be kAuto, kDp4a, kMma or kMmaF16 (got ",
                 int(options.core), ")");
  ENCORE_REQUIRE(options.mma_k_parts == 0 || options.mma_k_parts == 1 || options.mma_k_parts == 2 || options.mma_k_parts == 4 ||
                     options.mma_k_parts == 8,
                 StatusCode::kInvalidArgument, "q4k gemv: GemvLaunch::mma_k_parts must be 0 (auto), 1, 2, 4 or 8 (got ",
                 options.mma_k_parts, ")");
  ENCORE_REQUIRE(reinterpret_cast<std::uintptr_t>(options.act_image) % 16 == 0, StatusCode::kInvalidArgument,
                 "q4k gemv: GemvLaunch::act_image must be 16-byte aligned");
  return {};
}

// The device-ready plan of validated params p (mat, out, epilogue set) for a device of `sms` SMs.
Status plan_params(GemvTileParams p, int nmat, const GemvLaunch& options, int sms, gemv::GemvPlan* out) {
  ENCORE_RETURN_IF_ERROR(check_options(options));
  return dispatch_tokens(p.batch, [&](auto ntok) -> Status {
    constexpr int kTok = decltype(ntok)::value;
    std::size_t smem = 0;
    ENCORE_RETURN_IF_ERROR(plan_launch(p, kTok, nmat, smem, options, sms));
    *out = {p, nmat, kTok, smem};
    return {};
  });
}

template <int kTok>
auto kernel_of(const gemv::GemvPlan& plan) {
  using gemv::Core;
  if constexpr (kTok > gemv::kMaxCoreTokens) {
    return gemv_mma_kernel<kTok, 1, Core::kMmaF16>;  // (the only plan of the wide tier)
  } else {
    auto kernel = plan.matrices == 2 ? gemv_kernel<kTok, 2> : gemv_kernel<kTok, 1>;
    if constexpr (kTok >= 8) {
      if (gemv::core_of(plan.params) == Core::kMmaS8)
        kernel = plan.matrices == 2 ? gemv_mma_kernel<kTok, 2, Core::kMmaS8> : gemv_mma_kernel<kTok, 1, Core::kMmaS8>;
      if (gemv::core_of(plan.params) == Core::kMmaF16)
        kernel = plan.matrices == 2 ? gemv_mma_kernel<kTok, 2, Core::kMmaF16> : gemv_mma_kernel<kTok, 1, Core::kMmaF16>;
    }
    return kernel;
  }
}

// The activation image (GemvLaunch::act_image): every block's activation region of plan p (the
// fp16 core, one matrix) written once at the offsets of a block's shared memory, a task per warp
// over the whole grid (the blocks' own prologue spreads the same tasks over one block's warps).
template <int NTOK>
__global__ void __launch_bounds__(kBlockThreads) gemv_image_kernel(const __grid_constant__ GemvTileParams p, char* image) {
  const gemv::GemvSmem s(image, p, NTOK, 1, true);
  device::wait_for_upstream();
  device::allow_downstream();  // (the GEMV's wait is for this whole grid)
  const int warps = int(gridDim.x) * kWarpsPerBlock, warp = int(blockIdx.x) * kWarpsPerBlock + int(threadIdx.x / 32);
  gemv::detail::quantize_chunk<NTOK, true, gemv::kPrologueStaged<NTOK, 1, gemv::Core::kMmaF16>>(p, 0, p.k_blocks, s, warp, warps);
  if (blockIdx.x == 0 && p.batch < NTOK) gemv::detail::zero_missing_tokens_f16(p, NTOK, s);
}

Status launch_gemv(const GemvTileParams& p, int nmat, cudaStream_t stream, GemvLaunch options) {
  ENCORE_RETURN_IF_ERROR(check_options(options));  // (before the stream: bad options fail without a device)
  ENCORE_REQUIRE(p.batch <= gemv::kMaxCoreTokens || wide_tier_core(options.core),
                 StatusCode::kUnsupported, "q4k gemv: batch = ", p.batch, " (above ", gemv::kMaxCoreTokens,
                 ") runs on the fp16 core only; GemvLaunch::core asks for another");
  ENCORE_RETURN_IF_ERROR(detail::check_stream(stream));
  const int sms = detail::sm_count();
  gemv::GemvPlan plan;
  ENCORE_RETURN_IF_ERROR(plan_params(p, nmat, options, sms, &plan));
  const bool image = options.act_image && nmat == 1 && gemv::core_of(plan.params) == gemv::Core::kMmaF16;
  ENCORE_REQUIRE(!image || options.act_image_bytes >= plan.smem, StatusCode::kInvalidArgument, "q4k gemv: GemvLaunch::act_image_bytes = ",
                 options.act_image_bytes, ", this launch's image takes ", plan.smem);
  return dispatch_tokens(p.batch, [&](auto ntok) -> Status {
    constexpr int kTok = decltype(ntok)::value;
    if constexpr (kTok >= 8) {  // (the mma cores' tiers)
      if (image) {
        const int tasks = plan.params.batch * plan.params.k_blocks;
        ENCORE_RETURN_IF_ERROR(detail::launch(gemv_image_kernel<kTok>, (tasks + kWarpsPerBlock - 1) / kWarpsPerBlock, 0, stream,
                                              options.pdl, "q4k gemv image kernel", plan.params, static_cast<char*>(options.act_image)));
        plan.params.act_image = static_cast<const char*>(options.act_image);
      }
    }
    auto kernel = kernel_of<kTok>(plan);
    if (plan.smem > 48 * 1024)
      ENCORE_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(plan.smem)));
    int per_sm = 0;
    ENCORE_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kBlockThreads, plan.smem));
    const std::int64_t tiles = gemv::num_tiles(plan.params);
    const int grid = int(std::min<std::int64_t>(tiles, std::int64_t(std::max(per_sm, 1)) * sms));
    return detail::launch(kernel, grid, plan.smem, stream, options.pdl, "q4k gemv kernel", plan.params);
  });
}

// ---- validation shared by the three ops -------------------------------------------------------

struct Shape {
  std::int64_t n, k;
  int batch;
  std::int64_t x_stride, out_stride;
};

Shape shape_of(const Q4kGemvParams& a) { return {a.n, a.k, a.batch, a.x_stride ? a.x_stride : a.k, a.y_stride ? a.y_stride : a.n}; }
Shape shape_of(const RmsNormQ4kGemvParams& a) { return {a.n, a.k, a.batch, a.x_stride ? a.x_stride : a.k, a.y_stride ? a.y_stride : a.n}; }
Shape shape_of(const GateUpQ4kGemvParams& a) { return {a.n, a.k, a.batch, a.x_stride ? a.x_stride : a.k, a.h_stride ? a.h_stride : a.n}; }

Status validate_shape(const char* op, const Shape& s) {
  ENCORE_REQUIRE(s.k >= 256 && s.k % 256 == 0, StatusCode::kInvalidArgument, op, ": k must be a positive multiple of 256 (got ", s.k, ")");
  ENCORE_REQUIRE(s.k <= (std::int64_t(1) << 22), StatusCode::kInvalidArgument, op, ": k = ", s.k, " exceeds 4M");
  ENCORE_REQUIRE(s.n >= 1 && s.n <= (std::int64_t(1) << 30), StatusCode::kInvalidArgument, op, ": n must be in [1, 2^30] (got ", s.n, ")");
  ENCORE_REQUIRE(s.batch >= 1 && s.batch <= kMaxGemvBatch, StatusCode::kOutOfRange, op, ": batch must be in [1, ", kMaxGemvBatch, "] (got ", s.batch, ")");
  ENCORE_REQUIRE(s.x_stride >= s.k && s.x_stride % 4 == 0, StatusCode::kInvalidArgument, op,
                 ": x_stride must be >= k and a multiple of 4 (got ", s.x_stride, ")");
  ENCORE_REQUIRE(s.out_stride >= s.n, StatusCode::kInvalidArgument, op, ": output stride must be >= n (got ", s.out_stride, ")");
  return {};
}

std::size_t rows_bytes(int batch, std::int64_t stride, std::int64_t width) {
  return (std::size_t(batch - 1) * stride + width) * sizeof(float);
}

// Inputs that other threads read while outputs are written must not share memory with them.
Status validate_io(const char* op, const Shape& s, const void* const* weights, int nmat, const float* x, const float* gamma,
                   float* const* outs, int nout, const float* residual, float* normalized) {
  const std::size_t x_bytes = rows_bytes(s.batch, s.x_stride, s.k);
  const std::size_t out_bytes = rows_bytes(s.batch, s.out_stride, s.n);
  const std::size_t w_bytes = std::size_t(q4k::row_bytes(s.k)) * s.n;
  for (int m = 0; m < nmat; ++m) ENCORE_RETURN_IF_ERROR(detail::check_pointer(op, weights[m], 16, "weights[m]"));
  ENCORE_RETURN_IF_ERROR(detail::check_pointer(op, x, 16, "x"));
  if (gamma) ENCORE_RETURN_IF_ERROR(detail::check_pointer(op, gamma, 16, "gamma"));
  for (int o = 0; o < nout; ++o) {
    ENCORE_RETURN_IF_ERROR(detail::check_pointer(op, outs[o], 4, "output"));
    ENCORE_RETURN_IF_ERROR(detail::check_disjoint(op, {x, x_bytes, "x"}, {outs[o], out_bytes, "output"}));
    for (int m = 0; m < nmat; ++m)
      ENCORE_RETURN_IF_ERROR(detail::check_disjoint(op, {weights[m], w_bytes, "weights"}, {outs[o], out_bytes, "output"}));
    if (gamma) ENCORE_RETURN_IF_ERROR(detail::check_disjoint(op, {gamma, s.k * sizeof(float), "gamma"}, {outs[o], out_bytes, "output"}));
    for (int o2 = 0; o2 < o; ++o2)
      ENCORE_RETURN_IF_ERROR(detail::check_disjoint(op, {outs[o2], out_bytes, "gate output"}, {outs[o], out_bytes, "up output"}));
  }
  if (residual && residual != outs[0]) {  // residual == y is the in-place y += W x
    ENCORE_RETURN_IF_ERROR(detail::check_pointer(op, residual, 4, "residual"));
    ENCORE_RETURN_IF_ERROR(detail::check_disjoint(op, {residual, out_bytes, "residual"}, {outs[0], out_bytes, "y"}));
  }
  if (normalized) {
    const std::size_t n_bytes = std::size_t(s.batch) * s.k * sizeof(float);
    ENCORE_RETURN_IF_ERROR(detail::check_pointer(op, normalized, 4, "normalized"));
    ENCORE_RETURN_IF_ERROR(detail::check_disjoint(op, {x, x_bytes, "x"}, {normalized, n_bytes, "normalized"}));
    ENCORE_RETURN_IF_ERROR(detail::check_disjoint(op, {normalized, n_bytes, "normalized"}, {outs[0], out_bytes, "y"}));
  }
  return {};
}

GemvTileParams base_params(const Shape& s, const float* x, const float* gamma, float eps) {
  GemvTileParams p{};
  p.row_bytes = q4k::row_bytes(s.k);
  p.x = x;
  p.x_stride = s.x_stride;
  p.gamma = gamma;
  p.eps = eps;
  p.out_stride = s.out_stride;
  p.n = s.n;
  p.k_blocks = int(s.k / 256);
  p.batch = s.batch;
  return p;
}

// Runs the launch plan of a validated shape (host only). Up to kMaxCoreTokens tokens the dp4a plan
// is the one that can fail (the mma cores fall back to it); above, the fp16 core's is the only one.
Status check_plan(const Shape& s, int nmat) {
  GemvTileParams p = base_params(s, nullptr, nullptr, 0.f);
  std::size_t smem = 0;
  GemvLaunch only;
  only.core = s.batch > gemv::kMaxCoreTokens ? GemvCore::kMmaF16 : GemvCore::kDp4a;
  return dispatch_tokens(s.batch, [&](auto ntok) { return plan_launch(p, decltype(ntok)::value, nmat, smem, only, detail::sm_count()); });
}

}  // namespace

GemvCore q4k_gemv_core(std::int64_t k, int batch, int num_matrices, GemvCore requested) {
  if (k < 256 || k % 256 != 0 || batch < 1 || batch > kMaxGemvBatch || (num_matrices != 1 && num_matrices != 2))
    return GemvCore::kDp4a;  // such a launch fails validation; nothing runs
  GemvTileParams p{};
  p.n = 1;  // whether the mma plan fits does not depend on n
  p.k_blocks = int(k / 256);
  p.batch = batch;
  GemvLaunch launch;
  launch.core = requested;
  if (!plan_mma_if_chosen(p, token_tier(batch), num_matrices, launch, 1)) return GemvCore::kDp4a;
  return p.mma_f16 ? GemvCore::kMmaF16 : GemvCore::kMma;
}

int q4k_gemv_max_batch(std::int64_t k, int num_matrices) {
  return q4k_gemv_core(k, kMaxGemvBatch, num_matrices) == GemvCore::kMmaF16 ? kMaxGemvBatch : gemv::kMaxCoreTokens;
}

Status q4k_gemv_validate(const Q4kGemvParams& a) {
  const Shape s = shape_of(a);
  ENCORE_RETURN_IF_ERROR(validate_shape("q4k_gemv", s));
  ENCORE_RETURN_IF_ERROR(check_plan(s, 1));
  const void* w[] = {a.weight};
  float* outs[] = {a.y};
  return validate_io("q4k_gemv: weight", s, w, 1, a.x, nullptr, outs, 1, a.residual, nullptr);
}

namespace {
GemvTileParams tile_params(const Q4kGemvParams& a) {
  GemvTileParams p = base_params(shape_of(a), a.x, nullptr, 0.f);
  p.mat[0] = reinterpret_cast<const char*>(a.weight);
  p.out[0] = a.y;
  p.residual = a.residual;
  p.epilogue = gemv::Epilogue::kStore;
  return p;
}
}  // namespace

Status q4k_gemv(const Q4kGemvParams& a, cudaStream_t stream, GemvLaunch options) {
  ENCORE_RETURN_IF_ERROR(q4k_gemv_validate(a));
  return launch_gemv(tile_params(a), 1, stream, options);
}

Status rmsnorm_q4k_gemv_validate(const RmsNormQ4kGemvParams& a) {
  const Shape s = shape_of(a);
  ENCORE_RETURN_IF_ERROR(validate_shape("rmsnorm_q4k_gemv", s));
  ENCORE_RETURN_IF_ERROR(check_plan(s, 1));
  ENCORE_REQUIRE(a.gamma != nullptr, StatusCode::kNullPointer, "rmsnorm_q4k_gemv: gamma is null");
  ENCORE_REQUIRE(std::isfinite(a.eps) && a.eps > 0.f, StatusCode::kInvalidArgument, "rmsnorm_q4k_gemv: eps must be finite and > 0 (got ", a.eps, ")");
  const void* w[] = {a.weight};
  float* outs[] = {a.y};
  return validate_io("rmsnorm_q4k_gemv: weight", s, w, 1, a.x, a.gamma, outs, 1, a.residual, a.normalized);
}

namespace {
GemvTileParams tile_params(const RmsNormQ4kGemvParams& a) {
  GemvTileParams p = base_params(shape_of(a), a.x, a.gamma, a.eps);
  p.mat[0] = reinterpret_cast<const char*>(a.weight);
  p.out[0] = a.y;
  p.residual = a.residual;
  p.normalized = a.normalized;
  p.epilogue = gemv::Epilogue::kStore;
  return p;
}
}  // namespace

Status rmsnorm_q4k_gemv(const RmsNormQ4kGemvParams& a, cudaStream_t stream, GemvLaunch options) {
  ENCORE_RETURN_IF_ERROR(rmsnorm_q4k_gemv_validate(a));
  return launch_gemv(tile_params(a), 1, stream, options);
}

Status gate_up_q4k_gemv_validate(const GateUpQ4kGemvParams& a) {
  const Shape s = shape_of(a);
  ENCORE_RETURN_IF_ERROR(validate_shape("gate_up_q4k_gemv", s));
  ENCORE_RETURN_IF_ERROR(check_plan(s, 2));
  ENCORE_REQUIRE(a.output == GateUpOutput::kSiluMul || a.output == GateUpOutput::kRaw, StatusCode::kInvalidArgument,
                 "gate_up_q4k_gemv: output must be kSiluMul or kRaw (got ", int(a.output), ")");
  const bool raw = a.output == GateUpOutput::kRaw;
  ENCORE_REQUIRE(raw || a.up_out == nullptr, StatusCode::kInvalidArgument, "gate_up_q4k_gemv: up_out is only written in kRaw mode");
  if (a.gamma)
    ENCORE_REQUIRE(std::isfinite(a.eps) && a.eps > 0.f, StatusCode::kInvalidArgument, "gate_up_q4k_gemv: eps must be finite and > 0 (got ", a.eps, ")");
  const void* w[] = {a.gate, a.up};
  float* outs[] = {a.h, a.up_out};
  return validate_io("gate_up_q4k_gemv: gate/up", s, w, 2, a.x, a.gamma, outs, raw ? 2 : 1, nullptr, nullptr);
}

namespace {
GemvTileParams tile_params(const GateUpQ4kGemvParams& a) {
  GemvTileParams p = base_params(shape_of(a), a.x, a.gamma, a.eps);
  p.mat[0] = reinterpret_cast<const char*>(a.gate);
  p.mat[1] = reinterpret_cast<const char*>(a.up);
  p.out[0] = a.h;
  p.out[1] = a.up_out;
  p.epilogue = a.output == GateUpOutput::kRaw ? gemv::Epilogue::kRaw : gemv::Epilogue::kSiluMul;
  return p;
}
}  // namespace

Status gate_up_q4k_gemv(const GateUpQ4kGemvParams& a, cudaStream_t stream, GemvLaunch options) {
  ENCORE_RETURN_IF_ERROR(gate_up_q4k_gemv_validate(a));
  return launch_gemv(tile_params(a), 2, stream, options);
}

}  // namespace encore::ops

namespace encore::gemv {

Status plan_op(const ops::Q4kGemvParams& a, int sms, GemvPlan* out, ops::GemvLaunch options) {
  ENCORE_RETURN_IF_ERROR(ops::q4k_gemv_validate(a));
  return ops::plan_params(ops::tile_params(a), 1, options, sms, out);
}
Status plan_op(const ops::RmsNormQ4kGemvParams& a, int sms, GemvPlan* out, ops::GemvLaunch options) {
  ENCORE_RETURN_IF_ERROR(ops::rmsnorm_q4k_gemv_validate(a));
  return ops::plan_params(ops::tile_params(a), 1, options, sms, out);
}
Status plan_op(const ops::GateUpQ4kGemvParams& a, int sms, GemvPlan* out, ops::GemvLaunch options) {
  ENCORE_RETURN_IF_ERROR(ops::gate_up_q4k_gemv_validate(a));
  return ops::plan_params(ops::tile_params(a), 2, options, sms, out);
}

}  // namespace encore::gemv
