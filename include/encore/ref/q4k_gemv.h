// fp64 CPU references of the Q4_K GEMV family (dequantised weights, exact activations), plus the
// kernel's int8-activation arithmetic in double for tight checks of indexing and scaling.
#pragma once

#include <cstdint>
#include <vector>

#include <encore/q4k.h>

namespace encore::ref {

// y[b][r] = sum_j W[r][j] * x[b][j] (+ residual[b][r]); x rows x_stride apart, y rows n apart.
void q4k_gemv(const q4k::Block* w, std::int64_t n, std::int64_t k, const float* x, int batch, std::int64_t x_stride,
              const float* residual, double* y);

// out[j] = x[j] / sqrt(mean(x^2) + eps) * gamma[j]
void rmsnorm(const float* x, const float* gamma, std::int64_t k, double eps, double* out);

// y[b] = W (rmsnorm(x[b]) * gamma) (+ residual); `normalized` (optional) gets rmsnorm(x) * gamma.
void rmsnorm_q4k_gemv(const q4k::Block* w, std::int64_t n, std::int64_t k, const float* x, const float* gamma,
                      double eps, int batch, std::int64_t x_stride, const float* residual, double* y, double* normalized);

// h[b] = silu(Wg n[b]) * (Wu n[b]) with n = x, or rmsnorm(x)*gamma when gamma is set; raw: h = gate, up_out = up.
void gate_up_q4k_gemv(const q4k::Block* gate, const q4k::Block* up, std::int64_t n, std::int64_t k, const float* x,
                      const float* gamma, double eps, int batch, std::int64_t x_stride, bool raw, double* h, double* up_out);

// The kernels' activation format: int8 codes per value, scale amax/127 per 32 values (codes
// round half to even of v * (127/amax) in fp32), and fp32 sums of the unquantised values per 16.
struct Int8Activations {
  std::vector<std::int8_t> codes;  // [k]
  std::vector<float> scales;       // [k / 32]
  std::vector<float> sums;         // [k / 16]
};
Int8Activations quantize_activations(const float* v, std::int64_t k);

// y[r] = sum over sub-block halves of D*d*dot(q, codes) - M*sum, in double: what the kernel
// computes, up to fp32 accumulation order.
void q4k_gemv_int8(const q4k::Block* w, std::int64_t n, std::int64_t k, const Int8Activations& act, double* y);

// The fp16 core's activation format (activation_f16.cuh): per 256-value block a power of two 2^s
// with amax * 2^s in [2^14, 2^15), values fp16(v * 2^s), per sub-block the fp32 sum S of those
// values (the kernel's order) carried as hi = fp16(S / 32), lo = fp16(S / 32 - hi).
struct F16Activations {
  std::vector<float> values;      // [k] fp16(v * 2^s), as floats
  std::vector<float> block_scale; // [k / 256] 2^-s
  std::vector<float> sum_hi, sum_lo;  // [k / 32]
};
F16Activations quantize_activations_f16(const float* v, std::int64_t k);

// y[r] = sum over blocks of 2^-s * (D * sum sc * q * x' - M * sum_j 32 m_j (hi_j + lo_j)), in
// double: what the fp16 core computes, up to fp32 accumulation order. Its error against the exact
// product is within q4k_gemv_error_model's int8 bound (each value rounds by at most 2^-11 of itself).
void q4k_gemv_f16(const q4k::Block* w, std::int64_t n, std::int64_t k, const F16Activations& act, double* y);

// Per-row error model of the kernels for activations `a` (what the kernel quantises: x, or x*gamma):
//   int8_bound[r] = sum over sub-blocks s of (d_s / 2) * sum_{k in s} |W[r][k] + M[r][s]|
// bounds |kernel - exact| from the int8 rounding of a (d_s = amax_s/127; the min term uses exact
// sums); magnitude[r] = sum_k (|W[r][k]| + |M[r][s(k)]|) * |a_k| scales the fp32 accumulation error.
void q4k_gemv_error_model(const q4k::Block* w, std::int64_t n, std::int64_t k, const float* a, double* int8_bound,
                          double* magnitude);

}  // namespace encore::ref
