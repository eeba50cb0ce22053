// Device helpers shared by the MLA bodies: bf16 packing, the YaRN frequency, the step's error flag
// and the counters of the fused combine.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>

#include <encore/ops/mla.h>

#include "common/async_copy.cuh"
#include "common/counters.cuh"

namespace encore::mla {

using namespace ops;  // the op's public types and constants (encore/ops/mla.h)

using encore::device::cp_async_16;  // (shared with the other ops: common/async_copy.cuh)
using encore::device::cp_async_commit;
using encore::device::cp_async_wait;

// The fused combine's counters (common/counters.cuh).
using encore::device::add_release_gpu;
using encore::device::load_acquire_gpu;
using encore::device::wait_count_acquire;

__device__ __forceinline__ std::uint32_t pack_bf16x2(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<std::uint32_t*>(&v);
}

// theta'_i in double (DeepSeek-V3 YaRN, docs/mla.md §4); pos * theta' is formed in double too, so the
// angle stays exact to ~1e-12 rad even at position 128K.
__device__ __forceinline__ double rope_theta(const MlaRope& rope, int pair) {
  const double dim = kMlaRopeDim, base = rope.theta;
  const double theta = pow(base, -2.0 * pair / dim);
  const double two_log_base = 2.0 * log(base);
  const double low = fmax(floor(dim * log(rope.yarn_original_max_pos / (rope.beta_fast * 2.0 * 3.14159265358979323846)) / two_log_base), 0.0);
  double high = fmin(ceil(dim * log(rope.yarn_original_max_pos / (rope.beta_slow * 2.0 * 3.14159265358979323846)) / two_log_base), dim - 1);
  if (high == low) high += 0.001;
  const double gamma = fmin(fmax((pair - low) / (high - low), 0.0), 1.0);
  return theta * ((1.0 - gamma) + gamma / rope.yarn_factor);
}

// Rotates the adjacent pair (x0, x1) of pair index `pair` at `pos` (identity for NoPE).
__device__ __forceinline__ float2 rope_pair(const MlaRope& rope, int pos, int pair, float x0, float x1) {
  if (rope.mode == MlaRopeMode::kNone) return make_float2(x0, x1);
  double s, c;
  sincos(double(pos) * rope_theta(rope, pair), &s, &c);
  return make_float2(float(x0 * c - x1 * s), float(x0 * s + x1 * c));
}

// 1 / l for a softmax row's sum (l >= 1: its largest term is exp2(0) = 1), or 0 for an empty row
// (l = 0, or NaN from bad data). The compiler's correctly rounded division is exactly this for
// such l (MUFU.RCP and one Newton step: its fast path, normal l below 2^126); its slow path for
// the other ranges is a call, and in a separately compiled body (the megakernel's) that call makes
// ptxas serialise every wgmma.
__device__ __forceinline__ float inverse_row_sum(float l) {
  if (!(l > 0.f)) return 0.f;
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(l));
  return fmaf(r, -fmaf(l, r, -1.f), r);
}

// Nonzero when the scheduler flagged this step's device-side input (then nothing is written).
__device__ __forceinline__ bool step_flagged(const std::int32_t* error_flag) { return *error_flag != 0; }

}  // namespace encore::mla
