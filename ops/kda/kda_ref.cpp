// Double-precision reference of the KDA decode step; see include/encore/ref/kda.h.
#include <encore/ref/kda.h>

#include <cmath>
#include <cstddef>

namespace encore::ref {
namespace {

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
double softplus(double x) { return x > 20.0 ? x : std::log1p(std::exp(x)); }

}  // namespace

double kda_conv_channel(const double* history, double x, const float* w) {
  return double(w[0]) * history[0] + double(w[1]) * history[1] + double(w[2]) * history[2] + double(w[3]) * x;
}

std::vector<double> kda_recurrence_matrix_form(int D, const double* alpha, double beta, const double* k_hat,
                                               const double* q_hat, const double* v, double* state) {
  // transition[k1][k2] = (I - beta k k^T)[k1][k2] * alpha[k2]   (= (I - beta k k^T) Diag(alpha))
  std::vector<double> transition(std::size_t(D) * D);
  for (int k1 = 0; k1 < D; ++k1)
    for (int k2 = 0; k2 < D; ++k2)
      transition[std::size_t(k1) * D + k2] = ((k1 == k2 ? 1.0 : 0.0) - beta * k_hat[k1] * k_hat[k2]) * alpha[k2];
  // S[k][v] in the paper's K x V orientation, gathered from the V-first storage.
  std::vector<double> S(std::size_t(D) * D), S_new(std::size_t(D) * D, 0.0);
  for (int vv = 0; vv < D; ++vv)
    for (int k = 0; k < D; ++k) S[std::size_t(k) * D + vv] = state[std::size_t(vv) * D + k];
  for (int k1 = 0; k1 < D; ++k1) {
    double* out = &S_new[std::size_t(k1) * D];
    for (int k2 = 0; k2 < D; ++k2) {
      const double m = transition[std::size_t(k1) * D + k2];
      const double* in = &S[std::size_t(k2) * D];
      for (int vv = 0; vv < D; ++vv) out[vv] += m * in[vv];
    }
    for (int vv = 0; vv < D; ++vv) out[vv] += beta * k_hat[k1] * v[vv];
  }
  std::vector<double> o(D, 0.0);  // o = S_new^T q
  for (int k = 0; k < D; ++k)
    for (int vv = 0; vv < D; ++vv) o[vv] += S_new[std::size_t(k) * D + vv] * q_hat[k];
  for (int vv = 0; vv < D; ++vv)
    for (int k = 0; k < D; ++k) state[std::size_t(vv) * D + k] = S_new[std::size_t(k) * D + vv];
  return o;
}

std::vector<double> kda_recurrence_single_pass(int D, const double* alpha, double beta, const double* k_hat,
                                               const double* q_hat, const double* v, double* state) {
  double kq = 0;
  for (int k = 0; k < D; ++k) kq += k_hat[k] * q_hat[k];
  std::vector<double> o(D);
  for (int vv = 0; vv < D; ++vv) {
    double* row = state + std::size_t(vv) * D;
    double p = 0, a = 0;
    for (int k = 0; k < D; ++k) {
      row[k] *= alpha[k];
      p += row[k] * k_hat[k];
      a += row[k] * q_hat[k];
    }
    const double u = beta * (v[vv] - p);
    for (int k = 0; k < D; ++k) row[k] += k_hat[k] * u;
    o[vv] = a + kq * u;
  }
  return o;
}

void kda(const KdaRefDims& dims, const KdaRefWeights& w, const float* proj, std::int64_t proj_stride,
         const int* slot_ids, int batch, double* conv_state, double* recurrent_state, double* y) {
  const int H = dims.num_heads, D = dims.head_dim, R = dims.gate_rank;
  const std::int64_t P = std::int64_t(H) * D, channels = 3 * P;
  const std::int64_t fa_off = 3 * P, ga_off = fa_off + R, b_off = ga_off + R;
  const double q_scale = 1.0 / std::sqrt(double(D));
  for (int i = 0; i < batch; ++i) {
    const int slot = slot_ids[i];
    double* y_row = y + std::int64_t(i) * P;
    if (slot < 0) {
      for (std::int64_t c = 0; c < P; ++c) y_row[c] = 0.0;
      continue;
    }
    const float* x = proj + std::int64_t(i) * proj_stride;
    double* hist = conv_state + std::int64_t(slot) * 3 * channels;  // [3][channels]
    // 1. conv + SiLU over all 3*H*K channels, then advance the history.
    std::vector<double> qkv(channels);
    for (std::int64_t c = 0; c < channels; ++c) {
      const double h3[3] = {hist[c], hist[channels + c], hist[2 * channels + c]};
      const double conv = kda_conv_channel(h3, double(x[c]), w.conv_weight + 4 * c);
      qkv[c] = conv * sigmoid(conv);
      hist[c] = h3[1];
      hist[channels + c] = h3[2];
      hist[2 * channels + c] = double(x[c]);
    }
    for (int h = 0; h < H; ++h) {
      const double* q = &qkv[std::int64_t(h) * D];
      const double* k = &qkv[P + std::int64_t(h) * D];
      const double* v = &qkv[2 * P + std::int64_t(h) * D];
      // 2-4. gates.
      std::vector<double> alpha(D), gate(D);
      for (int j = 0; j < D; ++j) {
        const std::int64_t c = std::int64_t(h) * D + j;
        double f = 0, r = 0;
        for (int t = 0; t < R; ++t) {
          f += double(w.f_b_weight[c * R + t]) * double(x[fa_off + t]);
          r += double(w.g_b_weight[c * R + t]) * double(x[ga_off + t]);
        }
        const double g = -std::exp(double(w.A_log[h])) * softplus(f + double(w.dt_bias[c]));
        alpha[j] = std::exp(g);
        gate[j] = sigmoid(r);
      }
      const double beta = sigmoid(double(x[b_off + h]));
      // 5. L2 norms (eps inside the root), scale q after the norm.
      double qq = 0, kk = 0;
      for (int j = 0; j < D; ++j) {
        qq += q[j] * q[j];
        kk += k[j] * k[j];
      }
      std::vector<double> q_hat(D), k_hat(D);
      for (int j = 0; j < D; ++j) {
        q_hat[j] = q[j] / std::sqrt(qq + 1e-6) * q_scale;
        k_hat[j] = k[j] / std::sqrt(kk + 1e-6);
      }
      // 6. recurrence, matrix form.
      double* S = recurrent_state + (std::int64_t(slot) * H + h) * D * D;
      const std::vector<double> o = kda_recurrence_matrix_form(D, alpha.data(), beta, k_hat.data(), q_hat.data(), v, S);
      // 7. gated RMSNorm over the head.
      double ms = 0;
      for (int j = 0; j < D; ++j) ms += o[j] * o[j];
      const double inv_rms = 1.0 / std::sqrt(ms / D + dims.norm_eps);
      for (int j = 0; j < D; ++j) y_row[std::int64_t(h) * D + j] = o[j] * inv_rms * double(w.o_norm_weight[j]) * gate[j];
    }
  }
}

void kda_state_kv_to_vk(int H, int D, const float* kv, float* vk) {
  for (int h = 0; h < H; ++h)
    for (int k = 0; k < D; ++k)
      for (int v = 0; v < D; ++v)
        vk[(std::size_t(h) * D + v) * D + k] = kv[(std::size_t(h) * D + k) * D + v];
}

void kda_state_vk_to_kv(int H, int D, const float* vk, float* kv) {
  for (int h = 0; h < H; ++h)
    for (int v = 0; v < D; ++v)
      for (int k = 0; k < D; ++k)
        kv[(std::size_t(h) * D + k) * D + v] = vk[(std::size_t(h) * D + v) * D + k];
}

}  // namespace encore::ref
