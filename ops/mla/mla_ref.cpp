// Double-precision references for the MLA decode ops (docs/mla.md §3, §4, §11) and the CPU scheduler.
#include <encore/ref/mla.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <thread>

#include "mla/mla_plan.h"

namespace encore::ref {

using namespace encore::ops;

// Page by page (deliberately not the kernel's closed form): page j of request b sits at tape
// position start_b + C + j and belongs to part position / U (mla_plan.h).
MlaSchedule mla_sched(const std::vector<std::int32_t>& seq_lens, int num_parts, int fixed_overhead, int min_part_units) {
  const int n = int(seq_lens.size());
  MlaSchedule s;
  s.parts.assign(std::size_t(num_parts), MlaPartPlan{});
  s.num_splits.assign(std::size_t(n) + 1, 0);
  const int no_cap = std::numeric_limits<int>::max() / 2;
  std::vector<int> pages(n);
  long long total = 0;
  for (int b = 0; b < n; ++b) {
    pages[b] = mla::plan_pages(seq_lens[b], no_cap);
    total += pages[b] + fixed_overhead;
  }
  const int unit = mla::plan_unit(int(total), num_parts, min_part_units);  // the launcher keeps total < 2^31
  struct Range { int begin_req = -1, begin_page = 0, begin_split = 0, end_req = 0, end_page = 0; };
  std::vector<Range> parts(num_parts);
  std::vector<int> splits(n, 0);
  long long pos = 0;
  for (int b = 0; b < n; ++b) {
    pos += fixed_overhead;
    int owner = -1;
    for (int j = 0; j < pages[b]; ++j, ++pos) {
      const int part = int(pos / unit);
      if (part != owner) {  // a new split of b starts here
        owner = part;
        if (parts[part].begin_req < 0) parts[part] = {b, j, splits[b], b, j};
        ++splits[b];
      }
      parts[part].end_req = b;
      parts[part].end_page = j + 1;
    }
  }
  for (int b = 0; b < n; ++b) s.num_splits[b + 1] = s.num_splits[b] + splits[b];
  for (int k = 0; k < num_parts; ++k) {
    MlaPartPlan& m = s.parts[std::size_t(k)];
    const Range& r = parts[k];
    m.begin_req = r.begin_req;
    if (r.begin_req < 0) continue;
    m.end_req = r.end_req;
    m.begin_page = r.begin_page;
    m.end_page = r.end_page;
    m.begin_split = r.begin_split;
    m.first_is_split = splits[r.begin_req] > 1;
    m.last_is_split = splits[r.end_req] > 1;
  }
  return s;
}

double mla_rope_theta(const MlaRope& rope, int pair) {
  if (rope.mode == MlaRopeMode::kNone) return 0.0;
  const double dim = kMlaRopeDim, base = rope.theta;
  const double theta = std::pow(base, -2.0 * pair / dim);
  // Correction range of YaRN: the pair indices whose wavelength crosses beta_fast / beta_slow
  // rotations over the original context.
  auto correction = [&](double rotations) {
    return dim * std::log(rope.yarn_original_max_pos / (rotations * 2.0 * M_PI)) / (2.0 * std::log(base));
  };
  const double low = std::max(std::floor(correction(rope.beta_fast)), 0.0);
  double high = std::min(std::ceil(correction(rope.beta_slow)), dim - 1);
  if (high == low) high += 0.001;
  const double gamma = std::clamp((pair - low) / (high - low), 0.0, 1.0);
  return theta * ((1.0 - gamma) + gamma / rope.yarn_factor);
}

void mla_rope_apply(const MlaRope& rope, int pos, const double* in, double* out) {
  for (int i = 0; i < kMlaRopeDim / 2; ++i) {
    const double x0 = in[2 * i], x1 = in[2 * i + 1];
    if (rope.mode == MlaRopeMode::kNone) {
      out[2 * i] = x0;
      out[2 * i + 1] = x1;
      continue;
    }
    const double angle = pos * mla_rope_theta(rope, i);
    const double c = std::cos(angle), s = std::sin(angle);
    out[2 * i] = x0 * c - x1 * s;
    out[2 * i + 1] = x0 * s + x1 * c;
  }
}

std::vector<double> mla_kv_row(const float* kv_a, const float* norm_weight, double eps, int pos, const MlaRope& rope) {
  std::vector<double> row(kMlaRowDim);
  double sumsq = 0;
  for (int i = 0; i < kMlaLatentDim; ++i) sumsq += double(kv_a[i]) * kv_a[i];
  const double inv_rms = 1.0 / std::sqrt(sumsq / kMlaLatentDim + eps);
  for (int i = 0; i < kMlaLatentDim; ++i) row[i] = kv_a[i] * inv_rms * norm_weight[i];
  double pe[kMlaRopeDim];
  for (int i = 0; i < kMlaRopeDim; ++i) pe[i] = kv_a[kMlaLatentDim + i];
  mla_rope_apply(rope, pos, pe, row.data() + kMlaLatentDim);
  return row;
}

std::vector<double> mla_q_absorb(const float* q, const float* kv_b, int num_heads, int pos, const MlaRope& rope) {
  std::vector<double> out(std::size_t(num_heads) * kMlaRowDim, 0.0);
  for (int h = 0; h < num_heads; ++h) {
    const float* qh = q + std::size_t(h) * kMlaQHeadDim;
    const float* w_uk = kv_b + std::size_t(h) * kMlaKvbRowsPerHead * kMlaLatentDim;  // [128][512]
    double* o = out.data() + std::size_t(h) * kMlaRowDim;
    for (int i = 0; i < kMlaNopeDim; ++i)
      for (int j = 0; j < kMlaLatentDim; ++j) o[j] += double(qh[i]) * w_uk[std::size_t(i) * kMlaLatentDim + j];
    double pe[kMlaRopeDim];
    for (int i = 0; i < kMlaRopeDim; ++i) pe[i] = qh[kMlaNopeDim + i];
    mla_rope_apply(rope, pos, pe, o + kMlaLatentDim);
  }
  return out;
}

void mla_attention_absorbed(const float* q576, const float* rows, int len, int num_heads, double scale, double* o_lat,
                            double* lse) {
  std::vector<double> s(std::max(len, 1));
  for (int h = 0; h < num_heads; ++h) {
    const float* q = q576 + std::size_t(h) * kMlaRowDim;
    double* o = o_lat + std::size_t(h) * kMlaLatentDim;
    std::fill(o, o + kMlaLatentDim, 0.0);
    if (len == 0) {
      lse[h] = std::numeric_limits<double>::infinity();
      continue;
    }
    double mx = -std::numeric_limits<double>::infinity();
    for (int t = 0; t < len; ++t) {
      const float* k = rows + std::size_t(t) * kMlaRowDim;
      double dot = 0;
      for (int j = 0; j < kMlaRowDim; ++j) dot += double(q[j]) * k[j];
      s[t] = scale * dot;
      mx = std::max(mx, s[t]);
    }
    double sum = 0;
    for (int t = 0; t < len; ++t) {
      s[t] = std::exp(s[t] - mx);
      sum += s[t];
    }
    for (int t = 0; t < len; ++t) {
      const float* v = rows + std::size_t(t) * kMlaRowDim;
      const double p = s[t] / sum;
      for (int j = 0; j < kMlaLatentDim; ++j) o[j] += p * v[j];
    }
    lse[h] = mx + std::log(sum);
  }
}

void mla_attention_model(const float* q, int pos, const float* rows, int len, const float* kv_b, int num_heads,
                         double scale, const MlaRope& rope, double* o, int threads) {
  auto one_head = [&](int h) {
    const float* qh = q + std::size_t(h) * kMlaQHeadDim;
    const float* w_uk = kv_b + std::size_t(h) * kMlaKvbRowsPerHead * kMlaLatentDim;
    const float* w_uv = w_uk + std::size_t(kMlaNopeDim) * kMlaLatentDim;
    double* oh = o + std::size_t(h) * kMlaVHeadDim;
    std::fill(oh, oh + kMlaVHeadDim, 0.0);
    if (len == 0) return;
    double q_pe_in[kMlaRopeDim], q_pe[kMlaRopeDim];
    for (int i = 0; i < kMlaRopeDim; ++i) q_pe_in[i] = qh[kMlaNopeDim + i];
    mla_rope_apply(rope, pos, q_pe_in, q_pe);
    std::vector<double> s(len), vt(kMlaVHeadDim);
    double mx = -std::numeric_limits<double>::infinity();
    for (int t = 0; t < len; ++t) {
      const float* c = rows + std::size_t(t) * kMlaRowDim;
      double dot = 0;
      for (int i = 0; i < kMlaNopeDim; ++i) {  // k_nope[i] = W_UK[h][i] . c_t
        const float* w = w_uk + std::size_t(i) * kMlaLatentDim;
        double k = 0;
        for (int j = 0; j < kMlaLatentDim; ++j) k += double(w[j]) * c[j];
        dot += double(qh[i]) * k;
      }
      for (int i = 0; i < kMlaRopeDim; ++i) dot += q_pe[i] * c[kMlaLatentDim + i];
      s[t] = scale * dot;
      mx = std::max(mx, s[t]);
    }
    double sum = 0;
    for (int t = 0; t < len; ++t) sum += (s[t] = std::exp(s[t] - mx));
    for (int t = 0; t < len; ++t) {
      const float* c = rows + std::size_t(t) * kMlaRowDim;
      const double p = s[t] / sum;
      for (int i = 0; i < kMlaVHeadDim; ++i) {  // v[i] = W_UV[h][i] . c_t
        const float* w = w_uv + std::size_t(i) * kMlaLatentDim;
        double v = 0;
        for (int j = 0; j < kMlaLatentDim; ++j) v += double(w[j]) * c[j];
        oh[i] += p * v;
      }
    }
  };
  if (threads <= 0) threads = int(std::max(1u, std::thread::hardware_concurrency()));
  threads = std::min(threads, num_heads);
  if (threads <= 1) {
    for (int h = 0; h < num_heads; ++h) one_head(h);
    return;
  }
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      for (int h = t; h < num_heads; h += threads) one_head(h);
    });
  for (auto& th : pool) th.join();
}

void mla_v_up(const double* o_lat, const float* kv_b, int num_heads, double* o) {
  for (int h = 0; h < num_heads; ++h) {
    const float* w_uv = kv_b + (std::size_t(h) * kMlaKvbRowsPerHead + kMlaNopeDim) * kMlaLatentDim;
    for (int i = 0; i < kMlaVHeadDim; ++i) {
      double acc = 0;
      for (int j = 0; j < kMlaLatentDim; ++j)
        acc += double(w_uv[std::size_t(i) * kMlaLatentDim + j]) * o_lat[std::size_t(h) * kMlaLatentDim + j];
      o[std::size_t(h) * kMlaVHeadDim + i] = acc;
    }
  }
}

}  // namespace encore::ref
