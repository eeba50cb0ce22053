// Random KDA problems (realistic Kimi-Linear-style gate parameters, docs/kda.md §8 item 2) on the host, with
// the double-precision reference state beside them.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include <encore/ops/kda.h>
#include <encore/ref/kda.h>

#include "test_util.h"

namespace encore::test::kda {

// Round to bf16 (nearest even) and return the 16-bit pattern.
inline std::uint16_t to_bf16_bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return std::uint16_t(u >> 16);
}
inline float bf16_bits_to_float(std::uint16_t b) {
  std::uint32_t u = std::uint32_t(b) << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

enum class GateRegime {
  kRealistic,      // A_log = ln U(1,16), dt_bias = softplus^-1(dt), dt log-uniform [1e-3, 1e-1]
  kAlphaNearZero,  // dt_bias = +8
  kAlphaNearOne,   // A_log = -8
  kBetaSaturated,  // b = +-10
  kNearZeroK,      // one head's k input (and its history) ~1e-4: the L2-norm eps path
};

struct Problem {
  int H = 0, D = 0, R = 0, num_slots = 0;
  std::int64_t proj_width = 0, proj_stride = 0;
  GateRegime regime = GateRegime::kRealistic;
  std::vector<float> conv_weight, A_log, dt_bias, o_norm_weight;
  std::vector<std::uint16_t> f_b_bits, g_b_bits;
  std::vector<float> f_b, g_b;                         // the same bf16 values, widened
  std::vector<float> conv_state, recurrent_state;      // fp32 pools (GPU start values)
  std::vector<double> ref_conv_state, ref_recurrent_state;  // double pools carried by the reference

  ref::KdaRefDims ref_dims() const { return {H, D, R, 1e-5}; }
  ref::KdaRefWeights ref_weights() const {
    return {conv_weight.data(), A_log.data(), dt_bias.data(), f_b.data(), g_b.data(), o_norm_weight.data()};
  }
  std::int64_t P() const { return std::int64_t(H) * D; }
  std::int64_t conv_floats() const { return ops::kda_conv_state_floats_per_slot(H, D) * num_slots; }
  std::int64_t state_floats() const { return ops::kda_recurrent_state_floats_per_slot(H, D) * num_slots; }

  // proj rows ~ N(0, 1) (padding columns NaN so a stray read shows), with regime tweaks.
  std::vector<float> random_proj(int batch, std::mt19937_64& rng) const {
    std::vector<float> proj(std::size_t(batch) * proj_stride, NAN);
    std::normal_distribution<float> n01(0.f, 1.f);
    for (int i = 0; i < batch; ++i) {
      float* row = proj.data() + std::size_t(i) * proj_stride;
      for (std::int64_t c = 0; c < proj_width; ++c) row[c] = n01(rng);
      if (regime == GateRegime::kBetaSaturated)
        for (int h = 0; h < H; ++h) row[3 * P() + 2 * R + h] = (h % 2 ? -10.f : 10.f);
      if (regime == GateRegime::kNearZeroK)
        for (int j = 0; j < D; ++j) row[P() + j] *= 1e-4f;  // head 0's k channels
    }
    return proj;
  }
};

inline Problem make_problem(int H, int D, int R, int num_slots, std::mt19937_64& rng,
                            GateRegime regime = GateRegime::kRealistic) {
  Problem p;
  p.H = H, p.D = D, p.R = R, p.num_slots = num_slots, p.regime = regime;
  p.proj_width = 3LL * H * D + 2LL * R + H;
  p.proj_stride = (p.proj_width + 4 + 3) / 4 * 4;  // a little padding beyond the row
  const std::int64_t P = p.P();
  p.conv_weight = random_uniform(3 * P * 4, rng, -0.5f, 0.5f);  // kaiming-uniform bound for fan-in 4
  std::uniform_real_distribution<double> u01(0.0, 1.0);
  p.A_log.resize(H);
  for (auto& a : p.A_log) a = regime == GateRegime::kAlphaNearOne ? -8.f : float(std::log(1.0 + 15.0 * u01(rng)));
  p.dt_bias.resize(P);
  for (auto& b : p.dt_bias) {
    const double dt = std::exp(std::log(1e-3) + (std::log(1e-1) - std::log(1e-3)) * u01(rng));
    b = regime == GateRegime::kAlphaNearZero ? 8.f : float(std::log(std::expm1(dt)));  // softplus^-1(dt)
  }
  // W ~ N(0, 1/R) so that f = W f_a and r = W g_a are ~N(0, 1) for f_a, g_a ~ N(0, 1).
  const float w_std = 1.f / std::sqrt(float(R));
  for (auto* bits : {&p.f_b_bits, &p.g_b_bits}) {
    std::vector<float> w = random_normal(P * R, rng, 0.f, w_std);
    bits->resize(w.size());
    for (std::size_t i = 0; i < w.size(); ++i) (*bits)[i] = to_bf16_bits(w[i]);
  }
  p.f_b.resize(P * R), p.g_b.resize(P * R);
  for (std::int64_t i = 0; i < P * R; ++i) p.f_b[i] = bf16_bits_to_float(p.f_b_bits[i]), p.g_b[i] = bf16_bits_to_float(p.g_b_bits[i]);
  p.o_norm_weight = random_uniform(D, rng, 0.5f, 1.5f);
  p.conv_state = random_normal(p.conv_floats(), rng);
  if (regime == GateRegime::kNearZeroK)  // head 0's k history of every slot
    for (int s = 0; s < num_slots; ++s)
      for (int tap = 0; tap < 3; ++tap)
        for (int j = 0; j < D; ++j) p.conv_state[(std::int64_t(s) * 3 + tap) * 3 * P + P + j] *= 1e-4f;
  p.recurrent_state = random_normal(p.state_floats(), rng, 0.f, 0.05f);
  p.ref_conv_state.assign(p.conv_state.begin(), p.conv_state.end());
  p.ref_recurrent_state.assign(p.recurrent_state.begin(), p.recurrent_state.end());
  return p;
}

}  // namespace encore::test::kda
