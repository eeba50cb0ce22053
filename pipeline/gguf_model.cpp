#include <encore/pipeline/gguf_model.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string_view>

#include <cuda_bf16.h>

#include <encore/pipeline/weight_layout.h>
#include <encore/q4k.h>

#include "common/cuda_check.h"

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
      const gguf::ValueType e = kv_heads->value.element;
      ENCORE_REQUIRE(e != gguf::ValueType::kF32 && e != gguf::ValueType::kF64 && e != gguf::ValueType::kString && e != gguf::ValueType::kArray &&
                         e != gguf::ValueType::kBool,
                     StatusCode::kInvalidFile, f.name(), ": ", key("attention.head_count_kv"), " is an array of ", gguf::to_string(e),
                     " (integers expected)");
      gguf::Value v;
      ENCORE_RETURN_IF_ERROR(f.array_element(kv_heads->value, std::uint64_t(l), &v));
      n = v.type == gguf::ValueType::kI8 || v.type == gguf::ValueType::kI16 || v.type == gguf::ValueType::kI32 ||
                  v.type == gguf::ValueType::kI64
              ? v.i
              : std::int64_t(v.u);
      ENCORE_REQUIRE(n >= 0, StatusCode::kInvalidFile, f.name(), ": ", key("attention.head_count_kv"), "[", l, "] = ", n);
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
                         std::vector<TensorSource>* out, std::vector<Status>* refusals) {
  std::vector<TensorSource> plan;
  const std::string requantise = std::string(" (") + kQ4kFileAdvice + ")";
  // One weight's source, or why the file cannot give it.
  auto plan_one = [&](const TensorInfo& w, TensorSource& src) -> Status {
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
    return {};
  };
  Status first;
  for (const TensorInfo& w : weights.tensors()) {
    TensorSource src;
    const Status s = plan_one(w, src);
    if (s.ok()) {
      plan.push_back(std::move(src));
      continue;
    }
    if (first.ok()) first = s;
    if (!refusals) return first;
    refusals->push_back(s);
  }
  if (!first.ok()) return first;
  *out = std::move(plan);
  return {};
}

}  // namespace encore::pipeline

namespace encore::pipeline {

namespace {

// Decodes a whole file tensor to fp32.
Status decode_all(const gguf::TensorInfo& t, std::vector<float>& out) {
  out.resize(std::size_t(t.elements()));
  return gguf::decode(t.type, t.data, t.elements(), out.data());
}

void store_bf16(const std::vector<float>& v, __nv_bfloat16* o) {
  for (std::size_t i = 0; i < v.size(); ++i) o[i] = __float2bfloat16_rn(v[i]);
}

}  // namespace

Status convert_weight(const TensorSource& s, const TensorInfo& w, void* out) {
  ENCORE_REQUIRE(!s.from.empty() && out, StatusCode::kInvalidArgument, "convert_weight: ", w.name, " has no source or no output");
  const gguf::TensorInfo& t = *s.from.front();
  std::vector<float> v;
  switch (s.conversion) {
    case TensorConversion::kCopy:
      ENCORE_REQUIRE(t.bytes == std::uint64_t(w.bytes), StatusCode::kInvalidFile, "convert_weight: ", t.name, " has ", t.bytes,
                     " bytes; ", w.name, " takes ", w.bytes);
      std::memcpy(out, t.data, std::size_t(w.bytes));
      return {};
    case TensorConversion::kRowSlice: {
      const std::int64_t row = q4k::row_bytes(w.dims.back());
      ENCORE_REQUIRE((s.first_row + w.dims[0]) * row <= std::int64_t(t.bytes), StatusCode::kInvalidFile, "convert_weight: ", t.name,
                     " is too short for ", w.name);
      std::memcpy(out, static_cast<const char*>(t.data) + s.first_row * row, std::size_t(w.bytes));
      return {};
    }
    case TensorConversion::kToF32:
    case TensorConversion::kToBf16: {
      // In pieces of whole blocks, so a large tensor (the embedding) needs no fp32 copy of itself.
      std::int64_t block_values = 0, block_bytes = 0;
      gguf::block_shape(std::uint32_t(t.type), &block_values, &block_bytes);
      const std::int64_t piece = (std::int64_t(1) << 20) / block_values * block_values, total = t.elements();
      for (std::int64_t at = 0; at < total; at += piece) {
        const std::int64_t n = std::min(piece, total - at);
        v.resize(std::size_t(n));
        ENCORE_RETURN_IF_ERROR(gguf::decode(t.type, static_cast<const char*>(t.data) + at / block_values * block_bytes, n, v.data()));
        if (s.conversion == TensorConversion::kToF32)
          std::memcpy(static_cast<float*>(out) + at, v.data(), std::size_t(n) * 4);
        else
          store_bf16(v, static_cast<__nv_bfloat16*>(out) + at);
      }
      return {};
    }
    case TensorConversion::kLogNegA: {
      ENCORE_RETURN_IF_ERROR(decode_all(t, v));
      auto* o = static_cast<float*>(out);
      for (std::size_t i = 0; i < v.size(); ++i) o[i] = float(std::log(-double(v[i])));
      return {};
    }
    case TensorConversion::kKvBFromKAndV: {
      // encore: [head][nope + v][latent]. k_b (ggml dims [nope, latent, heads]): W_UK transposed per
      // head, element (h, c, n) at (h * latent + c) * nope + n; v_b ([latent, v, heads]): W_UV as is.
      const std::int64_t heads = w.dims[0], rows = w.dims[1], latent = w.dims[2];
      const std::int64_t nope = s.from[0]->dims[0], vdim = rows - nope;
      std::vector<float> k, vv, kv(std::size_t(heads * rows * latent));
      ENCORE_RETURN_IF_ERROR(decode_all(*s.from[0], k));
      ENCORE_RETURN_IF_ERROR(decode_all(*s.from[1], vv));
      for (std::int64_t h = 0; h < heads; ++h) {
        for (std::int64_t n = 0; n < nope; ++n)
          for (std::int64_t c = 0; c < latent; ++c) kv[std::size_t((h * rows + n) * latent + c)] = k[std::size_t((h * latent + c) * nope + n)];
        for (std::int64_t r = 0; r < vdim; ++r)
          std::memcpy(&kv[std::size_t((h * rows + nope + r) * latent)], &vv[std::size_t((h * vdim + r) * latent)], std::size_t(latent) * 4);
      }
      store_bf16(kv, static_cast<__nv_bfloat16*>(out));
      return {};
    }
  }
  return Status(StatusCode::kInvalidArgument, "convert_weight: unknown conversion for " + w.name);
}

Status load_gguf_weights(const std::vector<TensorSource>& plan, const TensorArena& weights, void* device_base, cudaStream_t stream,
                         bool progress) {
  ENCORE_REQUIRE(device_base, StatusCode::kNullPointer, "load_gguf_weights: device_base is null");
  ENCORE_REQUIRE(plan.size() == weights.tensors().size(), StatusCode::kInvalidArgument, "load_gguf_weights: the plan has ", plan.size(),
                 " tensors, the layout ", weights.tensors().size());
  // Two pinned buffers: the host converts into one while the other uploads.
  std::size_t chunk = std::size_t(64) << 20;
  for (const TensorInfo& w : weights.tensors()) chunk = std::max(chunk, std::size_t(w.bytes));
  void* staging[2] = {nullptr, nullptr};
  cudaEvent_t uploaded[2] = {nullptr, nullptr};
  auto release = [&] {
    for (int b = 0; b < 2; ++b) {
      if (uploaded[b]) cudaEventDestroy(uploaded[b]);
      if (staging[b]) cudaFreeHost(staging[b]);
    }
  };
  Status status;
  const auto start = std::chrono::steady_clock::now();
  double total = 0, done = 0;
  for (const TensorInfo& w : weights.tensors()) total += double(w.bytes);
  auto run = [&]() -> Status {
    for (int b = 0; b < 2; ++b) {
      ENCORE_CUDA_TRY(cudaMallocHost(&staging[b], chunk));
      ENCORE_CUDA_TRY(cudaEventCreateWithFlags(&uploaded[b], cudaEventDisableTiming));
    }
    int buffer = 0;
    std::size_t used = 0;
    std::vector<std::pair<std::size_t, const TensorInfo*>> pending;  // (offset in the buffer, tensor)
    auto flush = [&]() -> Status {
      for (const auto& [at, w] : pending)
        ENCORE_CUDA_TRY(cudaMemcpyAsync(static_cast<char*>(device_base) + w->offset, static_cast<char*>(staging[buffer]) + at,
                                        std::size_t(w->bytes), cudaMemcpyHostToDevice, stream));
      ENCORE_CUDA_TRY(cudaEventRecord(uploaded[buffer], stream));
      buffer ^= 1, used = 0, pending.clear();
      ENCORE_CUDA_TRY(cudaEventSynchronize(uploaded[buffer]));  // the next buffer's last upload is done
      return {};
    };
    for (std::size_t i = 0; i < plan.size(); ++i) {
      const TensorInfo& w = weights.tensors()[i];
      ENCORE_REQUIRE(plan[i].name == w.name, StatusCode::kInvalidArgument, "load_gguf_weights: plan entry ", i, " is ", plan[i].name,
                     ", the layout's ", w.name);
      if (used + std::size_t(w.bytes) > chunk) ENCORE_RETURN_IF_ERROR(flush());
      ENCORE_RETURN_IF_ERROR(convert_weight(plan[i], w, static_cast<char*>(staging[buffer]) + used));
      pending.emplace_back(used, &w);
      used += (std::size_t(w.bytes) + 255) / 256 * 256;
      done += double(w.bytes);
      if (progress) {
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        std::fprintf(stderr, "\rloading weights: %.2f / %.2f GB, %.2f GB/s, %.0f s left   ", done * 1e-9, total * 1e-9,
                     s > 0 ? done * 1e-9 / s : 0.0, s > 0 && done > 0 ? (total - done) * s / done : 0.0);
      }
    }
    if (!pending.empty()) ENCORE_RETURN_IF_ERROR(flush());
    ENCORE_CUDA_TRY(cudaStreamSynchronize(stream));
    if (progress) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::fprintf(stderr, "\rloaded %.2f GB of weights in %.1f s (%.2f GB/s)                    \n", total * 1e-9, s,
                   s > 0 ? total * 1e-9 / s : 0.0);
    }
    return {};
  };
  status = run();
  if (!status.ok()) cudaStreamSynchronize(stream);  // no upload may still read a buffer being freed
  release();
  return status;
}

}  // namespace encore::pipeline

namespace encore::pipeline {

namespace {

struct OutTensor {
  std::string name;
  std::vector<std::int64_t> ne;  // ggml order
  gguf::TensorType type;
  std::vector<unsigned char> data;
};

std::vector<std::int64_t> reversed(const std::vector<std::int64_t>& dims) { return {dims.rbegin(), dims.rend()}; }

}  // namespace

Status save_gguf(const std::string& path, const ModelConfig& c, const TensorArena& weights, const void* host_weights) {
  ENCORE_REQUIRE(host_weights, StatusCode::kNullPointer, "save_gguf: host_weights is null");
  ENCORE_RETURN_IF_ERROR(c.validate());
  ENCORE_REQUIRE(c.kda.heads == c.mla.heads || c.count(Attention::kKda) == 0 || c.count(Attention::kMla) == 0,
                 StatusCode::kUnsupported, "save_gguf: a kimi-linear file has one head count (KDA ", c.kda.heads, ", MLA ", c.mla.heads, ")");
  ENCORE_REQUIRE(c.mla.nope && c.mla.q_lora_rank == 0, StatusCode::kUnsupported,
                 "save_gguf: a kimi-linear file's MLA has no RoPE and no q LoRA");
  ENCORE_REQUIRE(c.moe.groups == 1 && c.moe.renormalise, StatusCode::kUnsupported,
                 "save_gguf: a kimi-linear file has no group stage and renormalises the routing weights");
  ENCORE_REQUIRE(c.moe.shared_experts <= 1 || c.count(Mlp::kMoe) == 0, StatusCode::kUnsupported,
                 "save_gguf: ", c.moe.shared_experts, " shared experts (llama.cpp stores them as one wider matrix; one is written)");
  const auto* base = static_cast<const unsigned char*>(host_weights);
  std::vector<OutTensor> out;
  for (const TensorInfo& w : weights.tensors()) {
    const unsigned char* data = base + w.offset;
    const std::string stem = w.name.rfind("blk.", 0) == 0 ? w.name.substr(w.name.find('.', 4) + 1) : w.name;
    const std::string prefix = w.name.substr(0, w.name.size() - stem.size());
    auto bf16_at = [&](std::int64_t i) {
      __nv_bfloat16 b;
      std::memcpy(&b, data + 2 * i, 2);
      return b;
    };
    if (stem == "ssm_a_log") {
      OutTensor t{prefix + "ssm_a", {1, w.dims[0]}, gguf::TensorType::kF32, std::vector<unsigned char>(std::size_t(w.bytes))};
      for (std::int64_t i = 0; i < w.bytes / 4; ++i) {
        float a;
        std::memcpy(&a, data + 4 * i, 4);
        const float v = float(-std::exp(double(a)));
        std::memcpy(t.data.data() + 4 * i, &v, 4);
      }
      out.push_back(std::move(t));
    } else if (stem == "attn_kv_b.weight") {  // [head][nope + v][latent] -> k_b [latent][nope] per head, v_b as is
      const std::int64_t heads = w.dims[0], rows = w.dims[1], latent = w.dims[2], nope = c.mla.nope_dim, vdim = rows - nope;
      OutTensor k{prefix + "attn_k_b.weight", {nope, latent, heads}, gguf::TensorType::kBF16,
                  std::vector<unsigned char>(std::size_t(heads * latent * nope * 2))};
      OutTensor v{prefix + "attn_v_b.weight", {latent, vdim, heads}, gguf::TensorType::kBF16,
                  std::vector<unsigned char>(std::size_t(heads * vdim * latent * 2))};
      for (std::int64_t h = 0; h < heads; ++h) {
        for (std::int64_t n = 0; n < nope; ++n)
          for (std::int64_t l = 0; l < latent; ++l) {
            const __nv_bfloat16 b = bf16_at((h * rows + n) * latent + l);
            std::memcpy(k.data.data() + 2 * ((h * latent + l) * nope + n), &b, 2);
          }
        std::memcpy(v.data.data() + 2 * h * vdim * latent, data + 2 * (h * rows + nope) * latent, std::size_t(vdim * latent * 2));
      }
      out.push_back(std::move(k));
      out.push_back(std::move(v));
    } else if (stem == "ffn_gate_inp.weight") {  // llama.cpp keeps the router in F32
      OutTensor t{w.name, reversed(w.dims), gguf::TensorType::kF32, std::vector<unsigned char>(std::size_t(w.bytes) * 2)};
      for (std::int64_t i = 0; i < w.bytes / 2; ++i) {
        const float f = __bfloat162float(bf16_at(i));
        std::memcpy(t.data.data() + 4 * i, &f, 4);
      }
      out.push_back(std::move(t));
    } else {
      const gguf::TensorType type = w.dtype == DType::kQ4K    ? gguf::TensorType::kQ4_K
                                    : w.dtype == DType::kBf16 ? gguf::TensorType::kBF16
                                                              : gguf::TensorType::kF32;
      ENCORE_REQUIRE(w.dtype == DType::kQ4K || w.dtype == DType::kBf16 || w.dtype == DType::kF32, StatusCode::kUnsupported,
                     "save_gguf: tensor ", w.name, " is ", to_string(w.dtype));
      // The shapes llama.cpp checks: conv taps [taps, 1, channels], a shared expert as a plain matrix.
      std::vector<std::int64_t> ne = reversed(w.dims);
      if (stem.rfind("ssm_conv1d_", 0) == 0) ne = {w.dims[1], 1, w.dims[0]};
      if (stem.find("_shexp.") != std::string::npos) ne = {w.dims[2], w.dims[1]};
      out.push_back({w.name, ne, type, std::vector<unsigned char>(data, data + w.bytes)});
    }
  }

  gguf::Writer img;
  img.put<std::uint32_t>(0x46554747), img.put<std::uint32_t>(3);
  img.put<std::uint64_t>(out.size());
  const std::size_t kv_count_at = img.bytes().size();
  img.put<std::uint64_t>(0);
  std::uint64_t keys = 0;
  auto count = [&](auto&& write) { write(), ++keys; };
  count([&] { img.text("general.architecture", kArch); });
  count([&] { img.text("general.name", c.name); });
  count([&] { img.u32("general.alignment", 32); });
  count([&] { img.text("tokenizer.ggml.model", "none"); });  // no vocabulary: llama.cpp sizes it from vocab_size
  count([&] { img.u32(key("block_count"), std::uint32_t(c.layers())); });
  count([&] { img.u32(key("context_length"), 1u << 20); });  // Kimi-Linear's; llama.cpp requires the key
  count([&] { img.u32(key("embedding_length"), std::uint32_t(c.hidden)); });
  count([&] { img.u32(key("feed_forward_length"), std::uint32_t(c.dense_width)); });
  count([&] { img.u32(key("vocab_size"), std::uint32_t(c.vocab)); });
  count([&] { img.u32(key("attention.head_count"), std::uint32_t(c.count(Attention::kKda) ? c.kda.heads : c.mla.heads)); });
  count([&] {
    img.key(key("attention.head_count_kv"), gguf::ValueType::kArray);
    img.put<std::uint32_t>(std::uint32_t(gguf::ValueType::kI32)), img.put<std::uint64_t>(std::uint64_t(c.layers()));
    for (Attention a : c.attention) img.put<std::int32_t>(a == Attention::kKda ? 0 : 1);
  });
  count([&] { img.f32(key("attention.layer_norm_rms_epsilon"), c.rms_eps); });
  count([&] { img.u32(key("leading_dense_block_count"), std::uint32_t(std::find(c.mlp.begin(), c.mlp.end(), Mlp::kMoe) - c.mlp.begin())); });
  if (c.count(Attention::kKda)) {
    count([&] { img.u32(key("kda.head_dim"), std::uint32_t(c.kda.head_dim)); });
    count([&] { img.u32(key("ssm.conv_kernel"), std::uint32_t(c.kda.conv_kernel)); });
  }
  if (c.count(Attention::kMla)) {
    count([&] { img.u32(key("attention.kv_lora_rank"), std::uint32_t(c.mla.kv_lora_rank)); });
    count([&] { img.u32(key("rope.dimension_count"), std::uint32_t(c.mla.rope_dim)); });
    count([&] { img.u32(key("attention.key_length"), std::uint32_t(c.mla.kv_lora_rank + c.mla.rope_dim)); });
    count([&] { img.u32(key("attention.key_length_mla"), std::uint32_t(c.mla.nope_dim + c.mla.rope_dim)); });
    count([&] { img.u32(key("attention.value_length_mla"), std::uint32_t(c.mla.v_dim)); });
  }
  if (c.count(Mlp::kMoe)) {
    count([&] { img.u32(key("expert_count"), std::uint32_t(c.moe.experts)); });
    count([&] { img.u32(key("expert_used_count"), std::uint32_t(c.moe.top_k)); });
    count([&] { img.u32(key("expert_feed_forward_length"), std::uint32_t(c.moe.expert_width)); });
    count([&] { img.u32(key("expert_shared_count"), std::uint32_t(c.moe.shared_experts)); });
    count([&] { img.u32(key("expert_gating_func"), c.moe.score == RouterScore::kSigmoid ? 2u : 1u); });
    count([&] { img.f32(key("expert_weights_scale"), c.moe.routed_scale); });
  }
  std::memcpy(img.bytes().data() + kv_count_at, &keys, 8);
  std::uint64_t offset = 0;
  for (const OutTensor& t : out) {
    img.str(t.name);
    img.put<std::uint32_t>(std::uint32_t(t.ne.size()));
    for (std::int64_t d : t.ne) img.put<std::uint64_t>(std::uint64_t(d));
    img.put<std::uint32_t>(std::uint32_t(t.type));
    img.put<std::uint64_t>(offset);
    offset = (offset + t.data.size() + 31) / 32 * 32;
  }
  img.pad_to(32);
  for (const OutTensor& t : out) {
    img.bytes().insert(img.bytes().end(), t.data.begin(), t.data.end());
    img.pad_to(32);
  }
  std::FILE* f = std::fopen(path.c_str(), "wb");
  ENCORE_REQUIRE(f, StatusCode::kInvalidFile, path, ": cannot create");
  const bool written = std::fwrite(img.bytes().data(), 1, img.bytes().size(), f) == img.bytes().size();
  const bool closed = std::fclose(f) == 0;
  ENCORE_REQUIRE(written && closed, StatusCode::kInvalidFile, path, ": write failed");
  return {};
}

}  // namespace encore::pipeline
