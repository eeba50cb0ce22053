// fp64 references of the MoE ops.
#include <encore/ref/moe.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>

#include <encore/ref/q4k_gemv.h>

namespace encore::ref {
namespace {

double bf16_to_double(std::uint16_t bits) {
  const std::uint32_t word = std::uint32_t(bits) << 16;
  float f;
  std::memcpy(&f, &word, sizeof f);
  return f;
}

// Round to nearest even (finite inputs), as __float2bfloat16.
std::uint16_t float_to_bf16_rne(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return std::uint16_t(u >> 16);
}

// Index of the best remaining entry: value descending, index ascending.
int argmax_lower_index(const std::vector<double>& v, const std::vector<bool>& taken) {
  int best = -1;
  for (int i = 0; i < int(v.size()); ++i)
    if (!taken[i] && (best < 0 || v[i] > v[best])) best = i;
  return best;
}

// A slot is used when its id is in range and not repeated earlier in the token (as on the device).
bool slot_valid(const int* ids, int slot, int num_experts) {
  const int e = ids[slot];
  if (e < 0 || e >= num_experts) return false;
  for (int j = 0; j < slot; ++j)
    if (ids[j] == e) return false;
  return true;
}

}  // namespace

void moe_input_norm(const float* x, const float* gamma, int batch, int hidden, double eps, float* h) {
  std::vector<double> row(hidden);
  for (int t = 0; t < batch; ++t) {
    rmsnorm(x + std::size_t(t) * hidden, gamma, hidden, eps, row.data());
    for (int i = 0; i < hidden; ++i) h[std::size_t(t) * hidden + i] = float(row[i]);
  }
}

void moe_router_logits(const void* weight, ops::MoeRouterDtype dtype, const float* h, int batch, int num_experts,
                       int hidden, double* logits) {
  for (int t = 0; t < batch; ++t)
    for (int e = 0; e < num_experts; ++e) {
      double acc = 0;
      for (int j = 0; j < hidden; ++j) {
        const std::size_t at = std::size_t(e) * hidden + j;
        const double w = dtype == ops::MoeRouterDtype::kFp32 ? double(static_cast<const float*>(weight)[at])
                                                             : bf16_to_double(static_cast<const std::uint16_t*>(weight)[at]);
        acc += w * h[std::size_t(t) * hidden + j];
      }
      logits[std::size_t(t) * num_experts + e] = acc;
    }
}

void moe_topk(const ops::MoeRoutingConfig& c, const float* logits, const float* bias, int batch, int* ids,
              double* weights, const int* slot_ids) {
  const int E = c.num_experts, k = c.top_k;
  const double kInf = std::numeric_limits<double>::infinity();
  const bool zero_mask = c.hf_remote_biased_weights || c.mask_fill_zero;
  for (int t = 0; t < batch; ++t) {
    if (slot_ids && slot_ids[t] < 0) {
      std::fill(ids + std::size_t(t) * k, ids + std::size_t(t + 1) * k, -1);
      std::fill(weights + std::size_t(t) * k, weights + std::size_t(t + 1) * k, 0.0);
      continue;
    }
    const float* u = logits + std::size_t(t) * E;
    std::vector<double> score(E), choice(E);
    if (c.score == ops::MoeScoreFunc::kSigmoid) {
      for (int e = 0; e < E; ++e) score[e] = 1.0 / (1.0 + std::exp(-double(u[e])));
    } else {
      double mx = -kInf, sum = 0;
      for (int e = 0; e < E; ++e) mx = std::max(mx, double(u[e]));
      for (int e = 0; e < E; ++e) sum += std::exp(double(u[e]) - mx);
      for (int e = 0; e < E; ++e) score[e] = std::exp(double(u[e]) - mx) / sum;
    }
    for (int e = 0; e < E; ++e) {
      choice[e] = score[e] + (bias ? double(bias[e]) : 0.0);
      if (std::isnan(choice[e])) choice[e] = -double(FLT_MAX);
    }
    const std::vector<double> biased = choice;

    if (c.n_group > 1 && c.topk_group < c.n_group) {
      const int per = E / c.n_group;
      std::vector<double> group_score(c.n_group);
      for (int g = 0; g < c.n_group; ++g) {
        std::vector<double> v(choice.begin() + g * per, choice.begin() + (g + 1) * per);
        std::sort(v.begin(), v.end(), std::greater<>());
        group_score[g] = (bias || c.hf_remote_biased_weights) ? v[0] + (per > 1 ? v[1] : 0.0) : v[0];
      }
      std::vector<bool> taken(c.n_group, false);
      for (int r = 0; r < c.topk_group; ++r) taken[argmax_lower_index(group_score, taken)] = true;
      for (int g = 0; g < c.n_group; ++g)
        if (!taken[g])
          for (int e = g * per; e < (g + 1) * per; ++e) choice[e] = zero_mask ? 0.0 : -kInf;
    }

    std::vector<bool> taken(E, false);
    double sum = 0;
    for (int j = 0; j < k; ++j) {
      const int e = argmax_lower_index(choice, taken);
      taken[e] = true;
      ids[std::size_t(t) * k + j] = e;
      const double w = c.hf_remote_biased_weights ? biased[e] : score[e];
      weights[std::size_t(t) * k + j] = w;
      sum += w;
    }
    const bool renorm = c.renormalize && (k > 1 || c.renormalize_top1);
    for (int j = 0; j < k; ++j) {
      double& w = weights[std::size_t(t) * k + j];
      if (renorm) w /= sum + double(c.renorm_eps);
      w *= c.routed_scale;
      if (c.weights_to_bf16) w = bf16_to_double(float_to_bf16_rne(float(w)));  // HF casts the fp32 weights
    }
  }
}

namespace {

// Codes of silu(g)*u whose scaled value lies this close (in code units) to a rounding midpoint can
// round either way on the device: its fp32 gate/up sums differ from the reference's doubles by
// ~1e-6 relative, i.e. <= 1.3e-4 code units; the window leaves an 8x margin.
constexpr float kAmbiguousWindow = 1e-3f;

// The weight of row `row`, column `col` of a Q4_K matrix with `cols` columns.
double q4k_weight(const q4k::Block* m, int cols, std::int64_t row, int col) {
  float values[q4k::kBlockValues];
  throw_if_error(q4k::dequantize_row(m + row * (cols / q4k::kBlockValues) + col / q4k::kBlockValues, values, q4k::kBlockValues));
  return values[col % q4k::kBlockValues];
}

// For each mid value whose int8 code is ambiguous, adds |down[:, c]| * one code step to slack[hidden].
void add_ambiguous_codes(const std::vector<float>& mid, const q4k::Block* down, int hidden, int inter, double route,
                         double* slack) {
  for (int s = 0; s < inter / 32; ++s) {
    float amax = 0.f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(mid[32 * s + i]));
    if (amax == 0.f) continue;
    const float inv = 127.f / amax;
    for (int i = 0; i < 32; ++i) {
      const float t = std::fabs(mid[32 * s + i] * inv);
      if (std::fabs(t - std::floor(t) - 0.5f) >= kAmbiguousWindow) continue;
      const double step = std::fabs(route) * double(amax) / 127.0;
      for (int r = 0; r < hidden; ++r) slack[r] += step * std::fabs(q4k_weight(down, inter, r, 32 * s + i));
    }
  }
}

}  // namespace

void moe_experts(const q4k::Block* gate, const q4k::Block* up, const q4k::Block* down, int num_experts, int num_shared,
                 int top_k, int hidden, int inter, int batch, const float* h, const int* ids, const float* weights,
                 bool int8_activations, double* out, const int* slot_ids, double* ambiguity) {
  const std::int64_t up_blocks = std::int64_t(inter) * (hidden / 256);   // blocks per gate/up matrix
  const std::int64_t down_blocks = std::int64_t(hidden) * (inter / 256);  // blocks per down matrix
  std::fill(out, out + std::size_t(batch) * hidden, 0.0);
  if (ambiguity) std::fill(ambiguity, ambiguity + std::size_t(batch) * hidden, 0.0);

  // Per token, its (expert, weight) pairs in ascending expert id, shared experts last.
  for (int e = 0; e < num_experts + num_shared; ++e) {
    std::vector<int> tokens;
    std::vector<double> route;
    for (int t = 0; t < batch; ++t) {
      if (slot_ids && slot_ids[t] < 0) continue;  // pad row: no work
      if (e >= num_experts) {
        tokens.push_back(t);
        route.push_back(1.0);
        continue;
      }
      for (int j = 0; j < top_k; ++j)
        if (ids[t * top_k + j] == e && slot_valid(ids + t * top_k, j, num_experts)) {
          tokens.push_back(t);
          route.push_back(weights[t * top_k + j]);
        }
    }
    if (tokens.empty()) continue;
    const q4k::Block* wg = gate + e * up_blocks;
    const q4k::Block* wu = up + e * up_blocks;
    const q4k::Block* wd = down + e * down_blocks;
    const int n = int(tokens.size());
    std::vector<double> g(std::size_t(n) * inter), u(std::size_t(n) * inter), y(std::size_t(n) * hidden);
    if (int8_activations) {
      for (int i = 0; i < n; ++i) {
        const Int8Activations act = quantize_activations(h + std::size_t(tokens[i]) * hidden, hidden);
        q4k_gemv_int8(wg, inter, hidden, act, g.data() + std::size_t(i) * inter);
        q4k_gemv_int8(wu, inter, hidden, act, u.data() + std::size_t(i) * inter);
        std::vector<float> mid(inter);
        for (int r = 0; r < inter; ++r) {
          const double gv = g[std::size_t(i) * inter + r];
          mid[r] = float(gv / (1.0 + std::exp(-gv)) * u[std::size_t(i) * inter + r]);
        }
        q4k_gemv_int8(wd, hidden, inter, quantize_activations(mid.data(), inter), y.data() + std::size_t(i) * hidden);
        if (ambiguity) add_ambiguous_codes(mid, wd, hidden, inter, route[i], ambiguity + std::size_t(tokens[i]) * hidden);
      }
    } else {
      std::vector<float> xs(std::size_t(n) * hidden), mid(std::size_t(n) * inter);
      for (int i = 0; i < n; ++i)
        std::copy(h + std::size_t(tokens[i]) * hidden, h + std::size_t(tokens[i] + 1) * hidden, xs.begin() + std::size_t(i) * hidden);
      gate_up_q4k_gemv(wg, wu, inter, hidden, xs.data(), nullptr, 0.0, n, hidden, false, g.data(), nullptr);
      // The down projection of the exact silu(g)*u: keep it in double through a dense product.
      std::vector<float> row(inter);
      for (int r = 0; r < hidden; ++r) {
        throw_if_error(q4k::dequantize_row(wd + std::int64_t(r) * (inter / 256), row.data(), inter));
        for (int i = 0; i < n; ++i) {
          double acc = 0;
          for (int c = 0; c < inter; ++c) acc += double(row[c]) * g[std::size_t(i) * inter + c];
          y[std::size_t(i) * hidden + r] = acc;
        }
      }
    }
    for (int i = 0; i < n; ++i)
      for (int r = 0; r < hidden; ++r) out[std::size_t(tokens[i]) * hidden + r] += route[i] * y[std::size_t(i) * hidden + r];
  }
}

}  // namespace encore::ref
