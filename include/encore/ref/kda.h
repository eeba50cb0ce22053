// Double-precision CPU reference of the KDA decode step (docs/kda.md §3), written in the
// literal matrix form S_t = (I - beta k k^T) Diag(alpha) S_{t-1} + beta k v^T, o = S_t^T q, with an
// explicit K x K transition matrix (a different association from the GPU's single pass, so algebra
// slips show). Layouts are those of encore::ops::KdaParams (V-first recurrent state).
#pragma once

#include <cstdint>
#include <vector>

namespace encore::ref {

struct KdaRefWeights {
  const float* conv_weight;    // [3*H*K][4]
  const float* A_log;          // [H]
  const float* dt_bias;        // [H*K]
  const float* f_b_weight;     // [H*K][rank] (bf16 values widened exactly to float)
  const float* g_b_weight;     // [H*V][rank]
  const float* o_norm_weight;  // [V]
};

struct KdaRefDims {
  int num_heads;
  int head_dim;  // K = V
  int gate_rank;
  double norm_eps = 1e-5;
};

// One step for `batch` rows. States are double and updated in place: conv_state
// [num_slots][3][3*H*K], recurrent_state [num_slots][H][V][K]. y: [batch][H*V], zeros for pad rows.
void kda(const KdaRefDims& dims, const KdaRefWeights& w, const float* proj, std::int64_t proj_stride,
         const int* slot_ids, int batch, double* conv_state, double* recurrent_state, double* y);

// The same recurrence for one head in the single-pass form the GPU uses (decay, p = S'^T k,
// u = beta (v - p), S += k u^T, o = S'^T q + (k.q) u), for the self-check of the matrix form.
// state: [V][K]; k and q already normalised; returns o [V].
std::vector<double> kda_recurrence_single_pass(int head_dim, const double* alpha, double beta, const double* k_hat,
                                               const double* q_hat, const double* v, double* state);
// Matrix form on one head (what kda() uses inside).
std::vector<double> kda_recurrence_matrix_form(int head_dim, const double* alpha, double beta, const double* k_hat,
                                               const double* q_hat, const double* v, double* state);

// Causal depthwise conv of one channel: history (x_{t-3}, x_{t-2}, x_{t-1}) and x_t, taps w[4].
double kda_conv_channel(const double* history, double x, const float* w);

// Host-side layout transposes for one slot: [H][K][V] <-> [H][V][K].
void kda_state_kv_to_vk(int num_heads, int head_dim, const float* kv, float* vk);
void kda_state_vk_to_kv(int num_heads, int head_dim, const float* vk, float* kv);

}  // namespace encore::ref
