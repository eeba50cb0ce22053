#include <encore/ref/q4k_gemv.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <thread>

#include "q4k/activation_f16_layout.h"

namespace encore::ref {
namespace {

// Rows are independent: split them over the host's cores (the lm_head-sized tests need it).
template <class F>
void parallel_rows(std::int64_t n, F&& body) {
  const int workers = int(std::clamp<std::int64_t>(std::thread::hardware_concurrency(), 1, std::max<std::int64_t>(1, n / 64)));
  std::vector<std::thread> pool;
  for (int w = 0; w < workers; ++w)
    pool.emplace_back([&, w] {
      std::vector<float> row;
      for (std::int64_t r = w; r < n; r += workers) body(r, row);
    });
  for (auto& t : pool) t.join();
}

// Dense W (dequantised) times `batch` double vectors.
void gemv_double(const q4k::Block* w, std::int64_t n, std::int64_t k, const std::vector<std::vector<double>>& xs,
                 std::vector<std::vector<double>>& ys) {
  const std::int64_t blocks = k / q4k::kBlockValues;
  for (auto& y : ys) y.assign(n, 0.0);
  parallel_rows(n, [&](std::int64_t r, std::vector<float>& row) {
    row.resize(k);
    throw_if_error(q4k::dequantize_row(w + r * blocks, row.data(), k));
    for (std::size_t b = 0; b < xs.size(); ++b) {
      double acc = 0;
      for (std::int64_t j = 0; j < k; ++j) acc += double(row[j]) * xs[b][j];
      ys[b][r] = acc;
    }
  });
}

std::vector<std::vector<double>> widen(const float* x, int batch, std::int64_t stride, std::int64_t k) {
  std::vector<std::vector<double>> xs(batch, std::vector<double>(k));
  for (int b = 0; b < batch; ++b)
    for (std::int64_t j = 0; j < k; ++j) xs[b][j] = x[b * stride + j];
  return xs;
}

std::vector<std::vector<double>> normalise(const float* x, const float* gamma, double eps, int batch, std::int64_t stride,
                                           std::int64_t k) {
  std::vector<std::vector<double>> xs(batch, std::vector<double>(k));
  for (int b = 0; b < batch; ++b) rmsnorm(x + b * stride, gamma, k, eps, xs[b].data());
  return xs;
}

}  // namespace

void rmsnorm(const float* x, const float* gamma, std::int64_t k, double eps, double* out) {
  double ss = 0;
  for (std::int64_t j = 0; j < k; ++j) ss += double(x[j]) * x[j];
  const double r = 1.0 / std::sqrt(ss / double(k) + eps);
  for (std::int64_t j = 0; j < k; ++j) out[j] = x[j] * r * gamma[j];
}

void q4k_gemv(const q4k::Block* w, std::int64_t n, std::int64_t k, const float* x, int batch, std::int64_t x_stride,
              const float* residual, double* y) {
  std::vector<std::vector<double>> ys(batch);
  gemv_double(w, n, k, widen(x, batch, x_stride, k), ys);
  for (int b = 0; b < batch; ++b)
    for (std::int64_t r = 0; r < n; ++r) y[b * n + r] = ys[b][r] + (residual ? residual[b * n + r] : 0.0);
}

void rmsnorm_q4k_gemv(const q4k::Block* w, std::int64_t n, std::int64_t k, const float* x, const float* gamma, double eps,
                      int batch, std::int64_t x_stride, const float* residual, double* y, double* normalized) {
  auto xs = normalise(x, gamma, eps, batch, x_stride, k);
  std::vector<std::vector<double>> ys(batch);
  gemv_double(w, n, k, xs, ys);
  for (int b = 0; b < batch; ++b) {
    for (std::int64_t r = 0; r < n; ++r) y[b * n + r] = ys[b][r] + (residual ? residual[b * n + r] : 0.0);
    if (normalized) std::copy(xs[b].begin(), xs[b].end(), normalized + b * k);
  }
}

void gate_up_q4k_gemv(const q4k::Block* gate, const q4k::Block* up, std::int64_t n, std::int64_t k, const float* x,
                      const float* gamma, double eps, int batch, std::int64_t x_stride, bool raw, double* h, double* up_out) {
  auto xs = gamma ? normalise(x, gamma, eps, batch, x_stride, k) : widen(x, batch, x_stride, k);
  std::vector<std::vector<double>> g(batch), u(batch);
  gemv_double(gate, n, k, xs, g);
  gemv_double(up, n, k, xs, u);
  for (int b = 0; b < batch; ++b)
    for (std::int64_t r = 0; r < n; ++r) {
      if (raw) {
        h[b * n + r] = g[b][r];
        up_out[b * n + r] = u[b][r];
      } else {
        h[b * n + r] = g[b][r] / (1.0 + std::exp(-g[b][r])) * u[b][r];
      }
    }
}

Int8Activations quantize_activations(const float* v, std::int64_t k) {
  Int8Activations a;
  a.codes.resize(k);
  a.scales.resize(k / 32);
  a.sums.resize(k / 16);
  for (std::int64_t s = 0; s < k / 32; ++s) {
    const float* x = v + 32 * s;
    float amax = 0.f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float inv = amax > 0.f ? 127.f / amax : 0.f;
    a.scales[s] = amax / 127.f;
    for (int i = 0; i < 32; ++i) a.codes[32 * s + i] = std::int8_t(std::nearbyint(x[i] * inv));
    for (int h = 0; h < 2; ++h) {
      float lo = 0.f, hi = 0.f;  // the kernel's order: two 8-value runs, then their sum
      for (int i = 0; i < 8; ++i) lo += x[16 * h + i];
      for (int i = 8; i < 16; ++i) hi += x[16 * h + i];
      a.sums[2 * s + h] = lo + hi;
    }
  }
  return a;
}

namespace {
// One Q4_K block's integer codes and scales, as the activation-mimicking references read them.
struct BlockCodes {
  std::uint8_t sc[8], m[8], q[256];  // q[32 s + i]: code i of sub-block s
  double d, dmin;
  explicit BlockCodes(const q4k::Block& blk) {
    q4k::unpack_scales(blk, sc, m);
    d = q4k::half_to_float(blk.d), dmin = q4k::half_to_float(blk.dmin);
    for (int s = 0; s < 8; ++s)
      for (int i = 0; i < 32; ++i) {
        const std::uint8_t byte = blk.qs[32 * (s / 2) + i];
        q[32 * s + i] = (s % 2 == 0) ? (byte & 0x0F) : (byte >> 4);
      }
  }
};
}  // namespace

void q4k_gemv_int8(const q4k::Block* w, std::int64_t n, std::int64_t k, const Int8Activations& act, double* y) {
  const std::int64_t blocks = k / q4k::kBlockValues;
  parallel_rows(n, [&](std::int64_t r, std::vector<float>&) {
    double acc = 0;
    for (std::int64_t b = 0; b < blocks; ++b) {
      const BlockCodes c(w[r * blocks + b]);
      for (int s = 0; s < 8; ++s) {
        const std::int64_t base = b * 256 + 32 * s;
        for (int h = 0; h < 2; ++h) {
          long dot = 0;
          for (int i = 16 * h; i < 16 * h + 16; ++i) dot += long(c.q[32 * s + i]) * act.codes[base + i];
          acc += c.d * c.sc[s] * act.scales[base / 32] * double(dot) - c.dmin * c.m[s] * act.sums[base / 16 + h];
        }
      }
    }
    y[r] = acc;
  });
}

F16Activations quantize_activations_f16(const float* v, std::int64_t k) {
  F16Activations a;
  a.values.resize(k);
  a.block_scale.resize(k / 256);
  a.sum_hi.resize(k / 32);
  a.sum_lo.resize(k / 32);
  auto round_half = [](float f) { return q4k::half_to_float(q4k::float_to_half(f)); };
  for (std::int64_t b = 0; b < k / 256; ++b) {
    const float* x = v + 256 * b;
    float amax = 0.f;
    for (int i = 0; i < 256; ++i) amax = std::max(amax, std::fabs(x[i]));
    std::uint32_t bits;
    std::memcpy(&bits, &amax, 4);
    const int s = q4k::f16_scale_exponent(int((bits >> 23) & 0xFF));
    const float up = std::ldexp(1.f, s);
    a.block_scale[b] = std::ldexp(1.f, -s);
    for (int i = 0; i < 256; ++i) a.values[256 * b + i] = round_half(x[i] * up);
    for (int j = 0; j < 8; ++j) {
      float lane_sum[4];  // the kernel's order: 8 values per lane, then a butterfly over 4 lanes
      for (int l = 0; l < 4; ++l) {
        lane_sum[l] = 0.f;
        for (int i = 0; i < 8; ++i) lane_sum[l] += a.values[256 * b + 32 * j + 8 * l + i];
      }
      const float sum = (lane_sum[0] + lane_sum[1]) + (lane_sum[2] + lane_sum[3]);
      const float scaled = sum * (1.f / 32.f);
      a.sum_hi[8 * b + j] = round_half(scaled);
      a.sum_lo[8 * b + j] = round_half(scaled - a.sum_hi[8 * b + j]);
    }
  }
  return a;
}

void q4k_gemv_f16(const q4k::Block* w, std::int64_t n, std::int64_t k, const F16Activations& act, double* y) {
  const std::int64_t blocks = k / q4k::kBlockValues;
  parallel_rows(n, [&](std::int64_t r, std::vector<float>&) {
    double acc = 0;
    for (std::int64_t b = 0; b < blocks; ++b) {
      const BlockCodes c(w[r * blocks + b]);
      double dot = 0, mins = 0;
      for (int s = 0; s < 8; ++s) {
        for (int i = 0; i < 32; ++i) dot += double(c.sc[s] * c.q[32 * s + i]) * act.values[b * 256 + 32 * s + i];
        mins += 32.0 * c.m[s] * (double(act.sum_hi[8 * b + s]) + double(act.sum_lo[8 * b + s]));
      }
      acc += double(act.block_scale[b]) * (c.d * dot - c.dmin * mins);
    }
    y[r] = acc;
  });
}

void q4k_gemv_error_model(const q4k::Block* w, std::int64_t n, std::int64_t k, const float* a, double* int8_bound,
                          double* magnitude) {
  const std::int64_t blocks = k / q4k::kBlockValues;
  std::vector<double> half_step(k / 32);
  for (std::int64_t s = 0; s < k / 32; ++s) {
    float amax = 0.f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(a[32 * s + i]));
    half_step[s] = 0.5 * double(amax / 127.f);
  }
  parallel_rows(n, [&](std::int64_t r, std::vector<float>& row) {
    row.resize(k);
    throw_if_error(q4k::dequantize_row(w + r * blocks, row.data(), k));
    double bound = 0, mag = 0;
    for (std::int64_t b = 0; b < blocks; ++b) {
      std::uint8_t sc[8], m[8];
      q4k::unpack_scales(w[r * blocks + b], sc, m);
      const double dmin = q4k::half_to_float(w[r * blocks + b].dmin);
      for (int s = 0; s < 8; ++s) {
        const double min_s = std::fabs(dmin * m[s]);
        for (int i = 0; i < 32; ++i) {
          const std::int64_t j = b * 256 + 32 * s + i;
          const double wq = std::fabs(double(row[j])) + min_s;  // >= |D*sc*q|
          bound += wq * half_step[j / 32];
          mag += wq * std::fabs(double(a[j]));
        }
      }
    }
    int8_bound[r] = bound;
    magnitude[r] = mag;
  });
}

}  // namespace encore::ref
