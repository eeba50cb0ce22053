// Standalone kernels and validating launchers of the Q4_K GEMV family.
#include <encore/ops/q4k_gemv.h>

#include <algorithm>
#include <type_traits>

#include "common/cuda_check.h"
#include "common/launch.cuh"
#include "gemv/gemv_tile.cuh"

namespace encore::ops {
namespace {

using gemv::GemvTileParams;

// Shared memory for the activations of one chunk (96 KB keeps two blocks per SM possible).
constexpr std::size_t kActivationBudget = 96 * 1024;

// Pulls the rows of `tile` into L2 (cp.async.bulk.prefetch): weights never depend on the
// previous kernel, so this runs before the PDL wait and overlaps the previous kernel's tail.
__device__ void prefetch_tile_l2(const GemvTileParams& p, int nmat, std::int64_t tile) {
  const int rows = gemv::rows_per_tile(p.rows_per_warp);
  const int r = threadIdx.x % rows, m = threadIdx.x / rows;
  const std::int64_t row = tile * rows + r;
  if (m >= nmat || row >= p.n || p.row_bytes >= (std::int64_t(1) << 31)) return;
  const char* src = p.mat[m] + row * p.row_bytes;
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src), "r"(std::uint32_t(p.row_bytes)) : "memory");
}

// The single-token, single-matrix bodies fit two blocks per SM (ncu: one fat block per SM left
// the schedulers idle 80% of cycles); the others need their registers and rely on the L2
// lookahead for bytes in flight.
template <int NTOK, int NMAT, int R>
__global__ void __launch_bounds__(kBlockThreads, NTOK * NMAT == 1 ? 2 : 1) gemv_kernel(const __grid_constant__ GemvTileParams p) {
  extern __shared__ __align__(16) char smem[];
  const std::int64_t tiles = gemv::num_tiles(p);
  // The block's first tiles stream from HBM into L2 while it waits for its inputs; each later
  // tile keeps `kLookahead` tiles in flight ahead of the one it computes.
  constexpr int kLookahead = 2;
  for (int ahead = 0; ahead < kLookahead; ++ahead)
    if (blockIdx.x + std::int64_t(ahead) * gridDim.x < tiles) prefetch_tile_l2(p, NMAT, blockIdx.x + std::int64_t(ahead) * gridDim.x);
  device::wait_for_upstream();
  device::allow_downstream();
  bool act_cached = false;
  for (std::int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const std::int64_t next = tile + std::int64_t(kLookahead) * gridDim.x;
    if (next < tiles) prefetch_tile_l2(p, NMAT, next);
    gemv::gemv_tile<NTOK, NMAT, R>(p, tile, smem, act_cached);
  }
}

// The token-count tiers the kernels are instantiated for.
template <class F>
Status dispatch_tokens(int batch, F&& f) {
  if (batch <= 1) return f(std::integral_constant<int, 1>{});
  if (batch <= 2) return f(std::integral_constant<int, 2>{});
  if (batch <= 4) return f(std::integral_constant<int, 4>{});
  if (batch <= 8) return f(std::integral_constant<int, 8>{});
  return f(std::integral_constant<int, 16>{});
}

// Rows per warp: 4 (each activation read feeds 4 rows; fewer prologues) for several tokens or at
// least two 32-row tiles per SM; otherwise 1 (8-row tiles) so a small matrix spreads over every SM.
int choose_rows_per_warp(std::int64_t n, int batch, int sms) {
  return batch >= 4 || n >= 2 * gemv::rows_per_tile(4) * std::int64_t(sms) ? 4 : 1;
}

Status launch_gemv(GemvTileParams p, int nmat, cudaStream_t stream, GemvLaunch options) {
  ENCORE_RETURN_IF_ERROR(detail::check_stream(stream));
  const int sms = detail::sm_count();
  // Gate/up pairs already reuse each activation read for two rows; four row pairs would spill.
  p.rows_per_warp = nmat == 2 ? 1 : choose_rows_per_warp(p.n, p.batch, sms);
  return dispatch_tokens(p.batch, [&](auto ntok) -> Status {
    constexpr int kTok = decltype(ntok)::value;
    p.chunk_blocks = int(std::min<std::size_t>(p.k_blocks, kActivationBudget / (kTok * gemv::kActBlockBytes)));
    const std::size_t smem = gemv::smem_bytes(kTok, p.chunk_blocks);
    auto kernel = nmat == 2 ? gemv_kernel<kTok, 2, 1> : p.rows_per_warp == 4 ? gemv_kernel<kTok, 1, 4> : gemv_kernel<kTok, 1, 1>;
    if (smem > 48 * 1024)
      ENCORE_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    int per_sm = 0;
    ENCORE_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kBlockThreads, smem));
    const std::int64_t tiles = gemv::num_tiles(p);
    const int grid = int(std::min<std::int64_t>(tiles, std::int64_t(std::max(per_sm, 1)) * sms));
    return detail::launch(kernel, grid, smem, stream, options.pdl, "q4k gemv kernel", p);
  });
}

// ---- validation shared by the three ops -------------------------------------------------------

struct Shape {
  std::int64_t n, k;
  int batch;
  std::int64_t x_stride, out_stride;
};

Status validate_shape(const char* op, const Shape& s) {
  ENCORE_REQUIRE(s.k >= 256 && s.k % 256 == 0, StatusCode::kInvalidArgument, op, ": k must be a positive multiple of 256 (got ", s.k, ")");
  ENCORE_REQUIRE(s.k <= (std::int64_t(1) << 22), StatusCode::kInvalidArgument, op, ": k = ", s.k, " exceeds 4M");
  ENCORE_REQUIRE(s.n >= 1 && s.n <= (std::int64_t(1) << 30), StatusCode::kInvalidArgument, op, ": n must be in [1, 2^30] (got ", s.n, ")");
  ENCORE_REQUIRE(s.batch >= 1 && s.batch <= kMaxGemvBatch, StatusCode::kInvalidArgument, op, ": batch must be in [1, ", kMaxGemvBatch, "] (got ", s.batch, ")");
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
  for (int m = 0; m < nmat; ++m) ENCORE_RETURN_IF_ERROR(detail::check_pointer(weights[m], 16, op));
  ENCORE_RETURN_IF_ERROR(detail::check_pointer(x, 16, "x"));
  if (gamma) ENCORE_RETURN_IF_ERROR(detail::check_pointer(gamma, 16, "gamma"));
  for (int o = 0; o < nout; ++o) {
    ENCORE_RETURN_IF_ERROR(detail::check_pointer(outs[o], 4, "output"));
    ENCORE_RETURN_IF_ERROR(detail::check_no_overlap(x, x_bytes, "x", outs[o], out_bytes, "output"));
    for (int m = 0; m < nmat; ++m)
      ENCORE_RETURN_IF_ERROR(detail::check_no_overlap(weights[m], w_bytes, "weights", outs[o], out_bytes, "output"));
    if (gamma) ENCORE_RETURN_IF_ERROR(detail::check_no_overlap(gamma, s.k * sizeof(float), "gamma", outs[o], out_bytes, "output"));
    for (int o2 = 0; o2 < o; ++o2)
      ENCORE_RETURN_IF_ERROR(detail::check_no_overlap(outs[o2], out_bytes, "gate output", outs[o], out_bytes, "up output"));
  }
  if (residual && residual != outs[0]) {  // residual == y is the in-place y += W x
    ENCORE_RETURN_IF_ERROR(detail::check_pointer(residual, 4, "residual"));
    ENCORE_RETURN_IF_ERROR(detail::check_no_overlap(residual, out_bytes, "residual", outs[0], out_bytes, "y"));
  }
  if (normalized) {
    const std::size_t n_bytes = std::size_t(s.batch) * s.k * sizeof(float);
    ENCORE_RETURN_IF_ERROR(detail::check_pointer(normalized, 4, "normalized"));
    ENCORE_RETURN_IF_ERROR(detail::check_no_overlap(x, x_bytes, "x", normalized, n_bytes, "normalized"));
    ENCORE_RETURN_IF_ERROR(detail::check_no_overlap(normalized, n_bytes, "normalized", outs[0], out_bytes, "y"));
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

}  // namespace

Status q4k_gemv(const Q4kGemvParams& a, cudaStream_t stream, GemvLaunch options) {
  const Shape s{a.n, a.k, a.batch, a.x_stride ? a.x_stride : a.k, a.y_stride ? a.y_stride : a.n};
  ENCORE_RETURN_IF_ERROR(validate_shape("q4k_gemv", s));
  const void* w[] = {a.weight};
  float* outs[] = {a.y};
  ENCORE_RETURN_IF_ERROR(validate_io("q4k_gemv: weight", s, w, 1, a.x, nullptr, outs, 1, a.residual, nullptr));
  GemvTileParams p = base_params(s, a.x, nullptr, 0.f);
  p.mat[0] = reinterpret_cast<const char*>(a.weight);
  p.out[0] = a.y;
  p.residual = a.residual;
  p.epilogue = gemv::Epilogue::kStore;
  return launch_gemv(p, 1, stream, options);
}

Status rmsnorm_q4k_gemv(const RmsNormQ4kGemvParams& a, cudaStream_t stream, GemvLaunch options) {
  const Shape s{a.n, a.k, a.batch, a.x_stride ? a.x_stride : a.k, a.y_stride ? a.y_stride : a.n};
  ENCORE_RETURN_IF_ERROR(validate_shape("rmsnorm_q4k_gemv", s));
  ENCORE_REQUIRE(a.gamma != nullptr, StatusCode::kNullPointer, "rmsnorm_q4k_gemv: gamma is null");
  ENCORE_REQUIRE(a.eps > 0.f, StatusCode::kInvalidArgument, "rmsnorm_q4k_gemv: eps must be positive");
  const void* w[] = {a.weight};
  float* outs[] = {a.y};
  ENCORE_RETURN_IF_ERROR(validate_io("rmsnorm_q4k_gemv: weight", s, w, 1, a.x, a.gamma, outs, 1, a.residual, a.normalized));
  GemvTileParams p = base_params(s, a.x, a.gamma, a.eps);
  p.mat[0] = reinterpret_cast<const char*>(a.weight);
  p.out[0] = a.y;
  p.residual = a.residual;
  p.normalized = a.normalized;
  p.epilogue = gemv::Epilogue::kStore;
  return launch_gemv(p, 1, stream, options);
}

Status gate_up_q4k_gemv(const GateUpQ4kGemvParams& a, cudaStream_t stream, GemvLaunch options) {
  const Shape s{a.n, a.k, a.batch, a.x_stride ? a.x_stride : a.k, a.h_stride ? a.h_stride : a.n};
  ENCORE_RETURN_IF_ERROR(validate_shape("gate_up_q4k_gemv", s));
  const bool raw = a.output == GateUpOutput::kRaw;
  ENCORE_REQUIRE(raw || a.up_out == nullptr, StatusCode::kInvalidArgument, "gate_up_q4k_gemv: up_out is only written in kRaw mode");
  if (a.gamma) ENCORE_REQUIRE(a.eps > 0.f, StatusCode::kInvalidArgument, "gate_up_q4k_gemv: eps must be positive");
  const void* w[] = {a.gate, a.up};
  float* outs[] = {a.h, a.up_out};
  ENCORE_RETURN_IF_ERROR(validate_io("gate_up_q4k_gemv: gate/up", s, w, 2, a.x, a.gamma, outs, raw ? 2 : 1, nullptr, nullptr));
  GemvTileParams p = base_params(s, a.x, a.gamma, a.eps);
  p.mat[0] = reinterpret_cast<const char*>(a.gate);
  p.mat[1] = reinterpret_cast<const char*>(a.up);
  p.out[0] = a.h;
  p.out[1] = a.up_out;
  p.epilogue = raw ? gemv::Epilogue::kRaw : gemv::Epilogue::kSiluMul;
  return launch_gemv(p, 2, stream, options);
}

}  // namespace encore::ops
