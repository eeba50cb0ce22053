#include <encore/pipeline/gguf_model.h>

#include <algorithm>
#include <cmath>
#include <string_view>

#include <encore/pipeline/weight_layout.h>

namespace encore::pipeline {

namespace {

constexpr std::string_view kArch = "kimi-linear";

std::string key(const char* suffix) { return std::string(kArch) + "." + suffix; }

// Integer keys the config needs, refused when absent, of another type, or outside [lo, hi].
Status read_int(const gguf::File& f, const std::string& k, std::int64_t lo, std::int64_t hi, int* out) {
  std::int64_t v = 0;
  ENCORE_RETURN_IF_ERROR(f.get(k, &v));
  ENCORE_REQUIRE(v >= lo && v <= hi, StatusCode::kUnsupported, f.name(), ": ", k, " = ", v, " (encore runs ", lo, " to ", hi, ")");
  *out = int(v);
  return {};
}
Status read_int_or(const gguf::File& f, const std::string& k, std::int64_t lo, std::int64_t hi, int fallback, int* out) {
  if (!f.find(k)) {
    *out = fallback;
    return {};
  }
  return read_int(f, k, lo, hi, out);
}

// The tensor's dims in encore's order (outermost first) with every 1 dropped, so that llama.cpp's
// padded shapes (conv taps [4, 1, P, 1], ssm_a [1, H, 1, 1]) compare with encore's.
std::vector<std::int64_t> squeezed(std::vector<std::int64_t> dims, bool reverse) {
  if (reverse) std::reverse(dims.begin(), dims.end());
  std::vector<std::int64_t> out;
  for (std::int64_t d : dims)
    if (d != 1) out.push_back(d);
  return out;
}

std::string dims_text(const std::vector<std::int64_t>& dims) {
  std::string s = "{";
  for (std::size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "}";
}

bool decodes_to_float(gguf::TensorType t) {
  using T = gguf::TensorType;
  return t == T::kF32 || t == T::kF16 || t == T::kBF16 || t == T::kQ8_0 || t == T::kQ5_0 || t == T::kQ5_1 || t == T::kQ4_0 ||
         t == T::kQ4_K;
}

}  // namespace

const char* to_string(TensorConversion c) {
  switch (c) {
    case TensorConversion::kCopy: return "copy";
    case TensorConversion::kToF32: return "to f32";
    case TensorConversion::kToBf16: return "to bf16";
    case TensorConversion::kLogNegA: return "log(-a)";
    case TensorConversion::kKvBFromKAndV: return "k_b + v_b";
    case TensorConversion::kRowSlice: return "rows of a fused tensor";
  }
  return "unknown";
}

Status model_config_from_gguf(const gguf::File& f, ModelConfig* out) {
  std::string arch;
  ENCORE_RETURN_IF_ERROR(f.get("general.architecture", &arch));
  ENCORE_REQUIRE(arch == kArch, StatusCode::kUnsupported, f.name(), ": general.architecture = ", arch, " (encore runs ", kArch, ")");
  ModelConfig c;
  if (f.find("general.name")) ENCORE_RETURN_IF_ERROR(f.get("general.name", &c.name));
  if (c.name.empty()) c.name = f.name();
  int layers = 0, dense = 0, heads = 0, key_mla = 0, rope = 0;
  ENCORE_RETURN_IF_ERROR(read_int(f, key("block_count"), 1, 512, &layers));
  ENCORE_RETURN_IF_ERROR(read_int(f, key("embedding_length"), 256, 1 << 16, &c.hidden));
  ENCORE_RETURN_IF_ERROR(read_int(f, key("feed_forward_length"), 1, 1 << 20, &c.dense_width));
  ENCORE_RETURN_IF_ERROR(read_int(f, key("attention.head_count"), 1, 1024, &heads));
  c.kda.heads = c.mla.heads = heads;
  double eps = 0;
  ENCORE_RETURN_IF_ERROR(f.get(key("attention.layer_norm_rms_epsilon"), &eps));
  ENCORE_REQUIRE(std::isfinite(eps) && eps > 0, StatusCode::kInvalidFile, f.name(), ": ", key("attention.layer_norm_rms_epsilon"),
                 " = ", eps);
  c.rms_eps = float(eps);

  // The layer kinds: head_count_kv per layer, 0 for a KDA (recurrent) layer, > 0 for MLA.
  const gguf::KeyValue* kv_heads = f.find(key("attention.head_count_kv"));
  ENCORE_REQUIRE(kv_heads, StatusCode::kInvalidFile, f.name(), ": key ", key("attention.head_count_kv"),
                 " is missing (it marks the KDA and MLA layers)");
  std::vector<int> kda_layers, mla_layers;  // 1-based
  for (int l = 0; l < layers; ++l) {
    std::int64_t n = 0;
    if (kv_heads->value.type == gguf::ValueType::kArray) {
      ENCORE_REQUIRE(kv_heads->value.count == std::uint64_t(layers), StatusCode::kInvalidFile, f.name(), ": ",
                     key("attention.head_count_kv"), " has ", kv_heads->value.count, " entries for ", layers, " layers");
      gguf::Value v;
      ENCORE_RETURN_IF_ERROR(f.array_element(kv_heads->value, std::uint64_t(l), &v));
      n = v.type == gguf::ValueType::kI32 || v.type == gguf::ValueType::kI64 ? v.i : std::int64_t(v.u);
    } else {
      ENCORE_RETURN_IF_ERROR(f.get(key("attention.head_count_kv"), &n));
    }
    (n == 0 ? kda_layers : mla_layers).push_back(l + 1);
  }
  ENCORE_RETURN_IF_ERROR(read_int_or(f, key("leading_dense_block_count"), 0, layers, 0, &dense));
  ENCORE_RETURN_IF_ERROR(ModelConfig::layers_from_lists(layers, kda_layers, mla_layers, dense, c));

  if (!kda_layers.empty()) {
    ENCORE_RETURN_IF_ERROR(read_int(f, key("kda.head_dim"), 64, 128, &c.kda.head_dim));
    ENCORE_REQUIRE(c.kda.head_dim == 64 || c.kda.head_dim == 128, StatusCode::kUnsupported, f.name(), ": ", key("kda.head_dim"), " = ",
                   c.kda.head_dim, " (encore runs 64 or 128)");
    ENCORE_RETURN_IF_ERROR(read_int(f, key("ssm.conv_kernel"), 4, 4, &c.kda.conv_kernel));
    // The gates' low rank is not a key: the f_a projection's rows.
    const std::string f_a = layer_tensor(kda_layers.front() - 1, "ssm_f_a.weight");
    const gguf::TensorInfo* t = f.tensor(f_a);
    ENCORE_REQUIRE(t && t->dims.size() >= 2, StatusCode::kInvalidFile, f.name(), ": tensor ", f_a, " is missing");
    c.kda.gate_rank = int(t->dims[1]);
  }
  if (!mla_layers.empty()) {
    ENCORE_RETURN_IF_ERROR(read_int(f, key("attention.kv_lora_rank"), 512, 512, &c.mla.kv_lora_rank));
    ENCORE_RETURN_IF_ERROR(read_int(f, key("rope.dimension_count"), 64, 64, &rope));
    ENCORE_RETURN_IF_ERROR(read_int(f, key("attention.key_length_mla"), rope + 1, 1024, &key_mla));
    ENCORE_RETURN_IF_ERROR(read_int(f, key("attention.value_length_mla"), 1, 1024, &c.mla.v_dim));
    ENCORE_RETURN_IF_ERROR(read_int_or(f, key("attention.q_lora_rank"), 0, 1 << 16, 0, &c.mla.q_lora_rank));
    c.mla.rope_dim = rope;
    c.mla.nope_dim = key_mla - rope;
    c.mla.nope = true;  // llama.cpp runs kimi-linear's MLA without rotation
    c.mla.softmax_scale = float(1.0 / std::sqrt(double(key_mla)));
  }
  if (c.count(Mlp::kMoe) > 0) {
    MoeConfig& m = c.moe;
    int gating = 0;
    ENCORE_RETURN_IF_ERROR(read_int(f, key("expert_count"), 1, 4096, &m.experts));
    ENCORE_RETURN_IF_ERROR(read_int(f, key("expert_used_count"), 1, 64, &m.top_k));
    ENCORE_RETURN_IF_ERROR(read_int(f, key("expert_feed_forward_length"), 1, 1 << 20, &m.expert_width));
    ENCORE_RETURN_IF_ERROR(read_int_or(f, key("expert_shared_count"), 0, 8, 0, &m.shared_experts));
    ENCORE_RETURN_IF_ERROR(read_int_or(f, key("expert_group_count"), 0, 64, 1, &m.groups));
    ENCORE_RETURN_IF_ERROR(read_int_or(f, key("expert_group_used_count"), 0, 64, 1, &m.kept_groups));
    m.groups = std::max(m.groups, 1);
    m.kept_groups = m.groups == 1 ? 1 : std::max(m.kept_groups, 1);
    ENCORE_RETURN_IF_ERROR(read_int(f, key("expert_gating_func"), 1, 2, &gating));
    m.score = gating == 2 ? RouterScore::kSigmoid : RouterScore::kSoftmax;
    bool norm = true;  // kimi-linear files do not write it: llama.cpp renormalises always
    if (f.find(key("expert_weights_norm"))) ENCORE_RETURN_IF_ERROR(f.get(key("expert_weights_norm"), &norm));
    m.renormalise = norm;
    double scale = 1.0;
    if (f.find(key("expert_weights_scale"))) ENCORE_RETURN_IF_ERROR(f.get(key("expert_weights_scale"), &scale));
    m.routed_scale = scale == 0.0 ? 1.f : float(scale);  // llama.cpp: 0 means no scaling
    const int first_moe = int(std::find(c.mlp.begin(), c.mlp.end(), Mlp::kMoe) - c.mlp.begin());
    m.selection_bias = f.tensor(layer_tensor(first_moe, "exp_probs_b.bias")) != nullptr;
  }
  // The vocabulary: vocab_size when written, else the embedding's rows.
  if (f.find(key("vocab_size"))) {
    ENCORE_RETURN_IF_ERROR(read_int(f, key("vocab_size"), 1, 1 << 24, &c.vocab));
  } else {
    const gguf::TensorInfo* e = f.tensor("token_embd.weight");
    ENCORE_REQUIRE(e && e->dims.size() == 2, StatusCode::kInvalidFile, f.name(), ": tensor token_embd.weight is missing");
    c.vocab = int(e->dims[1]);
  }
  const Status valid = c.validate();
  ENCORE_REQUIRE(valid.ok(), valid.code(), f.name(), ": ", valid.message());
  *out = std::move(c);
  return {};
}

Status plan_gguf_weights(const gguf::File& f, const ModelConfig& config, const TensorArena& weights,
                         std::vector<TensorSource>* out) {
  std::vector<TensorSource> plan;
  const std::string requantise = " (a file whose projections are all Q4_K works: llama-quantize --pure IN OUT Q4_K)";
  for (const TensorInfo& w : weights.tensors()) {
    TensorSource src;
    src.name = w.name;
    const std::vector<std::int64_t> want = squeezed(w.dims, false);
    auto need = [&](const std::string& n) -> const gguf::TensorInfo* { return f.tensor(n); };
    auto check_shape = [&](const gguf::TensorInfo& t, const std::vector<std::int64_t>& expect) -> Status {
      const std::vector<std::int64_t> got = squeezed(t.dims, true);
      ENCORE_REQUIRE(got == expect, StatusCode::kInvalidFile, f.name(), ": tensor ", t.name, " has shape ", dims_text(got),
                     "; the model needs ", dims_text(expect), " for ", w.name);
      return {};
    };
    auto float_source = [&](const gguf::TensorInfo& t) -> Status {
      ENCORE_REQUIRE(decodes_to_float(t.type), StatusCode::kUnsupported, f.name(), ": tensor ", t.name, " is ", gguf::to_string(t.type),
                     "; encore decodes F32, F16, BF16, Q8_0, Q5_0, Q5_1, Q4_0 and Q4_K into ", to_string(w.dtype));
      return check_shape(t, want);
    };
    const std::string base = w.name.rfind("blk.", 0) == 0 ? w.name.substr(w.name.find('.', 4) + 1) : w.name;
    const std::string prefix = w.name.substr(0, w.name.size() - base.size());

    if (base == "ssm_a_log") {  // llama.cpp's ssm_a (no .weight suffix) holds -exp(A_log)
      const gguf::TensorInfo* a = need(prefix + "ssm_a");
      ENCORE_REQUIRE(a, StatusCode::kInvalidFile, f.name(), ": tensor ", prefix, "ssm_a is missing");
      ENCORE_REQUIRE(a->type == gguf::TensorType::kF32, StatusCode::kUnsupported, f.name(), ": tensor ", a->name, " is ",
                     gguf::to_string(a->type), " (F32 expected)");
      ENCORE_RETURN_IF_ERROR(check_shape(*a, want));
      const float* v = static_cast<const float*>(a->data);
      for (std::int64_t i = 0; i < a->elements(); ++i)
        ENCORE_REQUIRE(v[i] < 0.f && std::isfinite(v[i]), StatusCode::kInvalidFile, f.name(), ": tensor ", a->name, "[", i, "] = ", v[i],
                       " (it holds -exp(A_log): every value negative)");
      src.from = {a}, src.conversion = TensorConversion::kLogNegA;
    } else if (base == "attn_kv_b.weight" && !need(w.name)) {  // split by llama.cpp's converter
      const gguf::TensorInfo *k = need(prefix + "attn_k_b.weight"), *v = need(prefix + "attn_v_b.weight");
      ENCORE_REQUIRE(k && v, StatusCode::kInvalidFile, f.name(), ": ", w.name, " needs ", prefix, "attn_k_b.weight and ", prefix,
                     "attn_v_b.weight (or an unsplit ", w.name, ")");
      const MlaConfig& m = config.mla;
      ENCORE_RETURN_IF_ERROR(check_shape(*k, squeezed({m.heads, m.kv_lora_rank, m.nope_dim}, false)));
      ENCORE_RETURN_IF_ERROR(check_shape(*v, squeezed({m.heads, m.v_dim, m.kv_lora_rank}, false)));
      for (const gguf::TensorInfo* t : {k, v})
        ENCORE_REQUIRE(decodes_to_float(t->type), StatusCode::kUnsupported, f.name(), ": tensor ", t->name, " is ",
                       gguf::to_string(t->type), "; encore decodes F32, F16, BF16, Q8_0, Q5_0, Q5_1, Q4_0 and Q4_K");
      src.from = {k, v}, src.conversion = TensorConversion::kKvBFromKAndV;
    } else if (const gguf::TensorInfo* t = need(w.name)) {
      if (w.dtype == DType::kQ4K) {
        ENCORE_REQUIRE(t->type == gguf::TensorType::kQ4_K, StatusCode::kUnsupported, f.name(), ": tensor ", t->name, " is ",
                       gguf::to_string(t->type), "; encore runs it as a Q4_K projection", requantise);
        ENCORE_RETURN_IF_ERROR(check_shape(*t, want));
        src.from = {t}, src.conversion = TensorConversion::kCopy;
      } else if (w.dtype == DType::kF32 && t->type == gguf::TensorType::kF32) {
        ENCORE_RETURN_IF_ERROR(check_shape(*t, want));
        src.from = {t}, src.conversion = TensorConversion::kCopy;
      } else {
        ENCORE_RETURN_IF_ERROR(float_source(*t));
        src.from = {t}, src.conversion = w.dtype == DType::kBf16 ? TensorConversion::kToBf16 : TensorConversion::kToF32;
      }
    } else if (base == "attn_q.weight" || base == "attn_k.weight" || base == "attn_v.weight") {  // a fused q|k|v
      const gguf::TensorInfo* qkv = need(prefix + "attn_qkv.weight");
      ENCORE_REQUIRE(qkv, StatusCode::kInvalidFile, f.name(), ": tensor ", w.name, " is missing (and no ", prefix, "attn_qkv.weight)");
      ENCORE_REQUIRE(qkv->type == gguf::TensorType::kQ4_K, StatusCode::kUnsupported, f.name(), ": tensor ", qkv->name, " is ",
                     gguf::to_string(qkv->type), "; encore runs it as a Q4_K projection", requantise);
      const std::int64_t rows = w.dims[0];
      ENCORE_RETURN_IF_ERROR(check_shape(*qkv, {3 * rows, w.dims[1]}));
      src.from = {qkv}, src.conversion = TensorConversion::kRowSlice;
      src.first_row = (base == "attn_q.weight" ? 0 : base == "attn_k.weight" ? 1 : 2) * rows;
    } else {
      return Status(StatusCode::kInvalidFile, f.name() + ": tensor " + w.name + " is missing");
    }
    plan.push_back(std::move(src));
  }
  *out = std::move(plan);
  return {};
}

}  // namespace encore::pipeline
