// fp64 reference of a whole decode step (ref/pipeline.h): docs/model.md §3 in the stage order of
// stage_list.cpp, built from the ops' references, with weights looked up by name.
#include <encore/ref/pipeline.h>

#include <cmath>
#include <string>

#include <cuda_bf16.h>

#include <encore/ops/mla.h>
#include <encore/pipeline/stage_list.h>
#include <encore/pipeline/weight_layout.h>
#include <encore/ref/kda.h>
#include <encore/ref/mla.h>
#include <encore/ref/moe.h>
#include <encore/ref/q4k_gemv.h>

namespace encore::ref {
namespace {

using namespace encore::pipeline;

float to_bf16_float(double v) { return __bfloat162float(__float2bfloat16_rn(float(v))); }

class Weights {
 public:
  Weights(const TensorArena& layout, const void* base) : layout_(layout), base_(static_cast<const char*>(base)) {}
  template <class T>
  const T* at(const std::string& name) const {
    const TensorInfo* t = layout_.find(name);
    if (!t) throw Error(Status(StatusCode::kInvalidArgument, "decode reference: no tensor " + name));
    return reinterpret_cast<const T*>(base_ + t->offset);
  }
  const q4k::Block* q4k(int l, const char* name) const { return at<q4k::Block>(layer_tensor(l, name)); }
  const float* f32(int l, const char* name) const { return at<float>(layer_tensor(l, name)); }
  // A bf16 tensor widened to float.
  std::vector<float> bf16(const std::string& name) const {
    const TensorInfo* t = layout_.find(name);
    const __nv_bfloat16* p = at<__nv_bfloat16>(name);
    std::vector<float> out(std::size_t(t->bytes / 2));
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = __bfloat162float(p[i]);
    return out;
  }

 private:
  const TensorArena& layout_;
  const char* base_;
};

// y[b] = W (rmsnorm(x[b]) * gamma, when gamma is given) for b < batch, [batch][n]. As in the
// kernels, the row that is (int8-)quantised is x * gamma in fp32 and 1/rms scales the dot products,
// so the int8 codes are the device's own.
std::vector<double> gemv(const q4k::Block* w, std::int64_t n, std::int64_t k, const float* x, std::int64_t x_stride, int batch,
                         const float* gamma, double eps, bool int8) {
  std::vector<double> y(std::size_t(batch) * n);
  std::vector<float> in(k);
  for (int b = 0; b < batch; ++b) {
    const float* row = x + b * x_stride;
    double scale = 1.0, ss = 0;
    for (std::int64_t j = 0; j < k; ++j) {
      in[j] = gamma ? row[j] * gamma[j] : row[j];
      ss += double(row[j]) * row[j];
    }
    if (gamma) scale = 1.0 / std::sqrt(ss / double(k) + eps);
    double* out = &y[std::size_t(b) * n];
    if (int8) ref::q4k_gemv_int8(w, n, k, ref::quantize_activations(in.data(), k), out);
    else ref::q4k_gemv(w, n, k, in.data(), 1, k, nullptr, out);
    for (std::int64_t r = 0; r < n; ++r) out[r] *= scale;
  }
  return y;
}

// x += y, rounded to fp32 (the kernels' residual add).
void add_residual(std::vector<float>& x, const std::vector<double>& y) {
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = float(double(x[i]) + y[i]);
}

std::vector<float> to_float(const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); }

struct Rows {  // the step inputs, padded to `batch` rows
  std::vector<std::int32_t> token, pos, len, slot, table;
};
Rows pad_rows(const StepInputs& in, int batch, int pages_per_seq) {
  Rows r;
  for (int b = 0; b < batch; ++b) {
    const bool real = std::size_t(b) < in.token_ids.size();
    r.token.push_back(real ? in.token_ids[b] : 0);
    r.pos.push_back(real ? in.positions[b] : 0);
    r.len.push_back(real ? in.seq_lens[b] : 0);
    r.slot.push_back(real ? in.slot_ids[b] : -1);
    for (int i = 0; i < pages_per_seq; ++i) r.table.push_back(real ? in.block_table[std::size_t(b) * pages_per_seq + i] : 0);
  }
  return r;
}

class Step {
 public:
  Step(const ModelConfig& c, const BufferOptions& o, const Weights& w, const Rows& rows, int batch, bool int8,
       DecodeRefState& st)
      : c_(c), o_(o), w_(w), r_(rows), B_(batch), int8_(int8), st_(st), eps_(c.rms_eps) {}

  std::vector<float> x;  // [B][hidden] residual stream

  void embed() {
    const std::vector<float> table = w_.bf16("token_embd.weight");
    x.resize(std::size_t(B_) * c_.hidden);
    for (int b = 0; b < B_; ++b)
      for (int i = 0; i < c_.hidden; ++i) x[std::size_t(b) * c_.hidden + i] = table[std::size_t(r_.token[b]) * c_.hidden + i];
  }

  void kda(int l) {
    const KdaConfig& k = c_.kda;
    const std::int64_t P = std::int64_t(k.heads) * k.head_dim, rows = 3 * P + 2 * k.gate_rank + k.heads;
    const std::vector<float> proj = to_float(gemv(w_.q4k(l, "attn_q.weight"), rows, c_.hidden, x.data(), c_.hidden, B_,
                                                  w_.f32(l, "attn_norm.weight"), eps_, int8_));
    const std::vector<float> f_b = w_.bf16(layer_tensor(l, "ssm_f_b.weight")), g_b = w_.bf16(layer_tensor(l, "ssm_g_b.weight"));
    KdaRefWeights kw{w_.f32(l, "ssm_conv1d_q.weight"), w_.f32(l, "ssm_a_log"), w_.f32(l, "ssm_dt.bias"), f_b.data(), g_b.data(),
                     w_.f32(l, "ssm_norm.weight")};
    KdaRefDims dims{k.heads, k.head_dim, k.gate_rank, eps_};
    std::vector<double> y(std::size_t(B_) * P);
    ref::kda(dims, kw, proj.data(), rows, r_.slot.data(), B_, st_.kda_conv[l].data(), st_.kda_recurrent[l].data(), y.data());
    const std::vector<float> yf = to_float(y);
    add_residual(x, gemv(w_.q4k(l, "attn_output.weight"), c_.hidden, P, yf.data(), P, B_, nullptr, 0, int8_));
  }

  void mla(int l) {
    const MlaConfig& m = c_.mla;
    const int H = m.heads;
    const std::int64_t q_cols = mla_q_columns(c_), width = q_cols + m.kv_lora_rank + m.rope_dim, q_width = std::int64_t(H) * ops::kMlaQHeadDim;
    const bool lora = m.q_lora_rank > 0;
    const std::vector<float> proj = to_float(gemv(w_.q4k(l, lora ? "attn_q_a.weight" : "attn_q.weight"), width, c_.hidden, x.data(),
                                                  c_.hidden, B_, w_.f32(l, "attn_norm.weight"), eps_, int8_));
    std::vector<float> q_b;
    if (lora)
      q_b = to_float(gemv(w_.q4k(l, "attn_q_b.weight"), q_width, m.q_lora_rank, proj.data(), width, B_,
                          w_.f32(l, "attn_q_a_norm.weight"), eps_, int8_));
    const std::vector<float> kv_b = w_.bf16(layer_tensor(l, "attn_kv_b.weight"));
    const ops::MlaRope rope = m.nope ? ops::mla_rope_none() : ops::mla_rope_deepseek_v3();
    std::vector<float>& cache = st_.mla_cache[l];
    constexpr int kRow = ops::kMlaRowDim, kPage = ops::kMlaPageTokens;
    auto page_row = [&](int b, int t) {
      return &cache[(std::size_t(r_.table[std::size_t(b) * o_.max_pages_per_seq + t / kPage]) * kPage + t % kPage) * kRow];
    };
    for (int b = 0; b < B_; ++b) {  // append every row's token first (its own page), then attend
      if (r_.slot[b] < 0) continue;
      const std::vector<double> row = ref::mla_kv_row(&proj[std::size_t(b) * width + q_cols], w_.f32(l, "attn_kv_a_norm.weight"), eps_,
                                                      r_.pos[b], rope);
      float* dst = page_row(b, r_.pos[b]);
      for (int i = 0; i < kRow; ++i) dst[i] = to_bf16_float(row[i]);
    }
    std::vector<float> v_out(std::size_t(B_) * H * m.v_dim, 0.f);
    for (int b = 0; b < B_; ++b) {
      if (r_.slot[b] < 0) continue;
      const float* q = lora ? &q_b[std::size_t(b) * q_width] : &proj[std::size_t(b) * width];
      const std::vector<double> q576 = ref::mla_q_absorb(q, kv_b.data(), H, r_.pos[b], rope);
      std::vector<float> q576f(q576.size());
      for (std::size_t i = 0; i < q576.size(); ++i) q576f[i] = to_bf16_float(q576[i]);
      std::vector<float> rows(std::size_t(r_.len[b]) * kRow);
      for (int t = 0; t < r_.len[b]; ++t) std::copy(page_row(b, t), page_row(b, t) + kRow, &rows[std::size_t(t) * kRow]);
      std::vector<double> o_lat(std::size_t(H) * ops::kMlaLatentDim), lse(H), o(std::size_t(H) * m.v_dim);
      ref::mla_attention_absorbed(q576f.data(), rows.data(), r_.len[b], H, m.softmax_scale, o_lat.data(), lse.data());
      for (double& v : o_lat) v = float(v);  // the device keeps o_lat in fp32
      ref::mla_v_up(o_lat.data(), kv_b.data(), H, o.data());
      for (std::size_t i = 0; i < o.size(); ++i) v_out[std::size_t(b) * o.size() + i] = float(o[i]);
    }
    add_residual(x, gemv(w_.q4k(l, "attn_output.weight"), c_.hidden, std::int64_t(H) * m.v_dim, v_out.data(),
                         std::int64_t(H) * m.v_dim, B_, nullptr, 0, int8_));
  }

  void dense(int l) {
    const std::int64_t n = c_.dense_width;
    const float* gamma = w_.f32(l, "ffn_norm.weight");
    const std::vector<double> g = gemv(w_.q4k(l, "ffn_gate.weight"), n, c_.hidden, x.data(), c_.hidden, B_, gamma, eps_, int8_);
    const std::vector<double> u = gemv(w_.q4k(l, "ffn_up.weight"), n, c_.hidden, x.data(), c_.hidden, B_, gamma, eps_, int8_);
    std::vector<float> h(g.size());
    for (std::size_t i = 0; i < h.size(); ++i) h[i] = float(g[i] / (1.0 + std::exp(-g[i])) * u[i]);
    add_residual(x, gemv(w_.q4k(l, "ffn_down.weight"), c_.hidden, n, h.data(), n, B_, nullptr, 0, int8_));
  }

  void moe(int l, const RoutingHook& hook) {
    const MoeConfig& e = c_.moe;
    std::vector<float> h(x.size());
    ref::moe_input_norm(x.data(), w_.f32(l, "ffn_norm.weight"), B_, c_.hidden, eps_, h.data());
    std::vector<double> logits(std::size_t(B_) * e.experts), weights_d(std::size_t(B_) * e.top_k);
    ref::moe_router_logits(w_.at<std::uint16_t>(layer_tensor(l, "ffn_gate_inp.weight")), ops::MoeRouterDtype::kBf16, h.data(), B_,
                           e.experts, c_.hidden, logits.data());
    const std::vector<float> logits_f = to_float(logits);
    std::vector<int> ids(std::size_t(B_) * e.top_k);
    ref::moe_topk(moe_routing(c_), logits_f.data(), e.selection_bias ? w_.f32(l, "exp_probs_b.bias") : nullptr, B_, ids.data(),
                  weights_d.data(), r_.slot.data());
    std::vector<float> weights = to_float(weights_d);
    if (hook) hook(l, ids, weights);
    std::vector<double> out(x.size());
    ref::moe_experts(w_.q4k(l, "ffn_gate_exps.weight"), w_.q4k(l, "ffn_up_exps.weight"), w_.q4k(l, "ffn_down_exps.weight"), e.experts,
                     e.shared_experts, e.top_k, c_.hidden, e.expert_width, B_, h.data(), ids.data(), weights.data(), int8_, out.data(),
                     r_.slot.data());
    add_residual(x, out);
  }

  std::vector<double> head() {
    const std::vector<double> y = gemv(w_.at<q4k::Block>("output.weight"), c_.vocab, c_.hidden, x.data(), c_.hidden, B_,
                                       w_.at<float>("output_norm.weight"), eps_, int8_);
    std::vector<double> logits(y.size());
    for (std::size_t i = 0; i < y.size(); ++i) logits[i] = float(y[i]);  // the device writes fp32 logits
    return logits;
  }

 private:
  const ModelConfig& c_;
  const BufferOptions& o_;
  const Weights& w_;
  const Rows& r_;
  const int B_;
  const bool int8_;
  DecodeRefState& st_;
  const double eps_;
};

}  // namespace

DecodeRefState decode_ref_state(const ModelConfig& c, const BufferOptions& o) {
  DecodeRefState s;
  s.kda_conv.resize(c.layers()), s.kda_recurrent.resize(c.layers()), s.mla_cache.resize(c.layers());
  for (int l = 0; l < c.layers(); ++l) {
    if (c.attention[l] == Attention::kKda) {
      const std::size_t P = std::size_t(c.kda.heads) * c.kda.head_dim;
      s.kda_conv[l].assign(std::size_t(o.max_slots) * 3 * 3 * P, 0.0);
      s.kda_recurrent[l].assign(std::size_t(o.max_slots) * P * c.kda.head_dim, 0.0);
    } else {
      s.mla_cache[l].assign(std::size_t(o.max_pages) * ops::kMlaPageTokens * ops::kMlaRowDim, 0.f);
    }
  }
  return s;
}

std::vector<double> decode_step(const ModelConfig& c, const BufferOptions& o, const TensorArena& layout, const void* weights,
                                const StepInputs& in, int batch, bool int8_activations, DecodeRefState& state,
                                const RoutingHook& routing, const ResidualHook& residual) {
  const Weights w(layout, weights);
  const Rows rows = pad_rows(in, batch, o.max_pages_per_seq);
  Step step(c, o, w, rows, batch, int8_activations, state);
  step.embed();
  for (int l = 0; l < c.layers(); ++l) {
    c.attention[l] == Attention::kKda ? step.kda(l) : step.mla(l);
    if (residual) residual(l, false, step.x);
    c.mlp[l] == Mlp::kDense ? step.dense(l) : step.moe(l, routing);
    if (residual) residual(l, true, step.x);
  }
  return step.head();
}

}  // namespace encore::ref
