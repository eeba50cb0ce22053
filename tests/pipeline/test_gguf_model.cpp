// A kimi-linear GGUF as encore sees it (CPU): the config its metadata describes and the source of
// every weight, on a small file written here with llama.cpp's names, shapes and the types
// llama-quantize gives them (Q4_K projections, Q5_0 rows of 128, F32 norms, conv taps and router).
#include <encore/pipeline/gguf_model.h>

#include <cuda_bf16.h>
#include <encore/pipeline/pipeline.h>
#include <encore/pipeline/weight_layout.h>
#include <encore/q4k.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "test_util.h"

namespace encore::pipeline {
namespace {

using gguf::TensorType;
using gguf::ValueType;

struct FileTensor {
  std::string name;
  std::vector<std::uint64_t> ne;  // ggml order
  TensorType type;
};

// The test model, ModelConfig::tiny_kimi_linear() as llama.cpp writes it: 4 layers (0 dense KDA,
// 1 KDA, 2 MLA, 3 KDA), hidden 256, 8 heads, 16 experts.
struct ModelFile {
  std::map<std::string, std::function<void(gguf::Writer&)>> keys;
  std::vector<FileTensor> tensors;
  float ssm_a = -0.5f;
  std::map<std::string, std::function<float(std::uint64_t)>> f32_values;  // F32 tensors' contents (else zeros)

  ModelFile() {
    auto u32 = [](std::uint32_t v) { return [v](gguf::Writer& w) { w.put<std::uint32_t>(std::uint32_t(ValueType::kU32)), w.put(v); }; };
    auto f32 = [](float v) { return [v](gguf::Writer& w) { w.put<std::uint32_t>(std::uint32_t(ValueType::kF32)), w.put(v); }; };
    keys["general.architecture"] = [](gguf::Writer& w) { w.put<std::uint32_t>(std::uint32_t(ValueType::kString)), w.str("kimi-linear"); };
    keys["general.name"] = [](gguf::Writer& w) { w.put<std::uint32_t>(std::uint32_t(ValueType::kString)), w.str("kimi-test"); };
    keys["kimi-linear.block_count"] = u32(4);
    keys["kimi-linear.embedding_length"] = u32(256);
    keys["kimi-linear.feed_forward_length"] = u32(512);
    keys["kimi-linear.attention.head_count"] = u32(8);
    keys["kimi-linear.attention.head_count_kv"] = [](gguf::Writer& w) {
      w.put<std::uint32_t>(std::uint32_t(ValueType::kArray)), w.put<std::uint32_t>(std::uint32_t(ValueType::kI32));
      w.put<std::uint64_t>(4);
      for (int v : {0, 0, 1, 0}) w.put<std::int32_t>(v);
    };
    keys["kimi-linear.attention.layer_norm_rms_epsilon"] = f32(1e-5f);
    keys["kimi-linear.attention.kv_lora_rank"] = u32(512);
    keys["kimi-linear.attention.key_length_mla"] = u32(192);
    keys["kimi-linear.attention.value_length_mla"] = u32(128);
    keys["kimi-linear.rope.dimension_count"] = u32(64);
    keys["kimi-linear.kda.head_dim"] = u32(128);
    keys["kimi-linear.ssm.conv_kernel"] = u32(4);
    keys["kimi-linear.expert_count"] = u32(16);
    keys["kimi-linear.expert_used_count"] = u32(4);
    keys["kimi-linear.expert_feed_forward_length"] = u32(256);
    keys["kimi-linear.expert_shared_count"] = u32(1);
    keys["kimi-linear.leading_dense_block_count"] = u32(1);
    keys["kimi-linear.expert_gating_func"] = u32(2);
    keys["kimi-linear.expert_weights_scale"] = f32(2.446f);
    keys["kimi-linear.vocab_size"] = u32(512);

    const auto Q = TensorType::kQ4_K, F = TensorType::kF32, Q5 = TensorType::kQ5_0;
    tensors = {{"token_embd.weight", {256, 512}, Q}, {"output_norm.weight", {256}, F}, {"output.weight", {256, 512}, Q}};
    for (int l = 0; l < 4; ++l) {
      auto add = [&](const char* base, std::vector<std::uint64_t> ne, TensorType t) { tensors.push_back({layer_tensor(l, base), ne, t}); };
      add("attn_norm.weight", {256}, F);
      add("ffn_norm.weight", {256}, F);
      if (l == 2) {
        add("attn_q.weight", {256, 8 * 192}, Q);
        add("attn_kv_a_mqa.weight", {256, 576}, Q);
        add("attn_kv_a_norm.weight", {512}, F);
        add("attn_k_b.weight", {128, 512, 8}, Q5);
        add("attn_v_b.weight", {512, 128, 8}, Q);
      } else {
        for (const char* n : {"attn_q.weight", "attn_k.weight", "attn_v.weight"}) add(n, {256, 1024}, Q);
        for (const char* n : {"ssm_conv1d_q.weight", "ssm_conv1d_k.weight", "ssm_conv1d_v.weight"}) add(n, {4, 1, 1024, 1}, F);
        add("ssm_a", {1, 8, 1, 1}, F);
        add("ssm_dt.bias", {1024}, F);
        add("ssm_f_a.weight", {256, 128}, Q);
        add("ssm_f_b.weight", {128, 1024}, Q5);
        add("ssm_beta.weight", {256, 8}, Q);
        add("ssm_g_a.weight", {256, 128}, Q);
        add("ssm_g_b.weight", {128, 1024}, Q5);
        add("ssm_norm.weight", {128}, F);
      }
      add("attn_output.weight", {1024, 256}, Q);
      if (l == 0) {
        add("ffn_gate.weight", {256, 512}, Q);
        add("ffn_up.weight", {256, 512}, Q);
        add("ffn_down.weight", {512, 256}, Q);
      } else {
        add("ffn_gate_inp.weight", {256, 16}, F);
        add("exp_probs_b.bias", {16}, F);
        add("ffn_gate_exps.weight", {256, 256, 16}, Q);
        add("ffn_up_exps.weight", {256, 256, 16}, Q);
        add("ffn_down_exps.weight", {256, 256, 16}, Q);
        add("ffn_gate_shexp.weight", {256, 256}, Q);
        add("ffn_up_shexp.weight", {256, 256}, Q);
        add("ffn_down_shexp.weight", {256, 256}, Q);
      }
    }
  }
  FileTensor* find(const std::string& name) {
    for (FileTensor& t : tensors)
      if (t.name == name) return &t;
    return nullptr;
  }
  void drop(const std::string& name) {
    std::erase_if(tensors, [&](const FileTensor& t) { return t.name == name; });
  }

  std::vector<unsigned char> write() const {
    gguf::Writer w;
    w.put<std::uint32_t>(0x46554747), w.put<std::uint32_t>(3);
    w.put<std::uint64_t>(tensors.size()), w.put<std::uint64_t>(keys.size());
    for (const auto& [k, value] : keys) {
      w.str(k);
      value(w);
    }
    std::vector<std::uint64_t> bytes;
    std::uint64_t offset = 0;
    for (const FileTensor& t : tensors) {
      std::int64_t values = 0, block = 0;
      EXPECT_TRUE(gguf::block_shape(std::uint32_t(t.type), &values, &block));
      std::uint64_t n = 1;
      for (std::uint64_t d : t.ne) n *= d;
      bytes.push_back(n / std::uint64_t(values) * std::uint64_t(block));
      w.str(t.name);
      w.put<std::uint32_t>(std::uint32_t(t.ne.size()));
      for (std::uint64_t d : t.ne) w.put(d);
      w.put<std::uint32_t>(std::uint32_t(t.type));
      w.put(offset);
      offset = (offset + bytes.back() + 31) / 32 * 32;
    }
    w.pad_to(32);
    const std::size_t data = w.bytes().size();
    w.bytes().resize(data + offset, 0);
    std::uint64_t at = 0;
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      if (tensors[i].name.size() > 5 && tensors[i].name.substr(tensors[i].name.size() - 5) == "ssm_a")
        for (std::uint64_t j = 0; j < bytes[i] / 4; ++j) std::memcpy(w.bytes().data() + data + at + 4 * j, &ssm_a, 4);
      if (auto fill = f32_values.find(tensors[i].name); fill != f32_values.end())
        for (std::uint64_t j = 0; j < bytes[i] / 4; ++j) {
          const float v = fill->second(j);
          std::memcpy(w.bytes().data() + data + at + 4 * j, &v, 4);
        }
      at = (at + bytes[i] + 31) / 32 * 32;
    }
    return w.bytes();
  }
};

// A test file written and read back, with the model it describes (`configured`: the verdict of
// model_config_from_gguf) and that model's weight layout.
struct Parsed {
  std::vector<unsigned char> bytes;
  gguf::File file;
  ModelConfig config;
  Status configured;
  TensorArena weights;
  explicit Parsed(const ModelFile& m) : bytes(m.write()) {
    EXPECT_TRUE(gguf::File::parse(bytes.data(), bytes.size(), "kimi.gguf", file).ok());
    configured = model_config_from_gguf(file, &config);
    if (configured.ok()) EXPECT_TRUE(build_weight_layout(config, weights).ok());
  }
  Status plan(std::vector<TensorSource>* out, std::vector<Status>* refusals = nullptr) const {
    return plan_gguf_weights(file, config, weights, out, refusals);
  }
};

TEST(GgufModel, ConfigFromKimiLinearMetadata) {
  const Parsed p{ModelFile{}};
  ENCORE_OK(p.configured);
  const ModelConfig& c = p.config;
  EXPECT_EQ(c.name, "kimi-test");
  EXPECT_EQ(c.layers(), 4);
  EXPECT_EQ(c.attention, (std::vector<Attention>{Attention::kKda, Attention::kKda, Attention::kMla, Attention::kKda}));
  EXPECT_EQ(c.mlp, (std::vector<Mlp>{Mlp::kDense, Mlp::kMoe, Mlp::kMoe, Mlp::kMoe}));
  EXPECT_EQ(c.hidden, 256);
  EXPECT_EQ(c.vocab, 512);
  EXPECT_EQ(c.dense_width, 512);
  EXPECT_EQ(c.rms_eps, 1e-5f);
  EXPECT_EQ(c.kda.heads, 8);
  EXPECT_EQ(c.kda.head_dim, 128);
  EXPECT_EQ(c.kda.gate_rank, 128);
  EXPECT_EQ(c.mla.heads, 8);
  EXPECT_EQ(c.mla.nope_dim, 128);
  EXPECT_EQ(c.mla.v_dim, 128);
  EXPECT_TRUE(c.mla.nope);
  EXPECT_FLOAT_EQ(c.mla.softmax_scale, ModelConfig::kimi_linear_48b().mla.softmax_scale);
  EXPECT_EQ(c.moe.experts, 16);
  EXPECT_EQ(c.moe.top_k, 4);
  EXPECT_EQ(c.moe.expert_width, 256);
  EXPECT_EQ(c.moe.shared_experts, 1);
  EXPECT_EQ(c.moe.groups, 1);
  EXPECT_EQ(c.moe.score, RouterScore::kSigmoid);
  EXPECT_TRUE(c.moe.selection_bias);
  EXPECT_TRUE(c.moe.renormalise);
  EXPECT_FLOAT_EQ(c.moe.routed_scale, 2.446f);
}

TEST(GgufModel, ConfigRefusalsNameTheKey) {
  auto refused = [](const char* what, auto edit, StatusCode code, const char* needle) {
    ModelFile m;
    edit(m);
    const Parsed p{m};
    const Status& s = p.configured;
    EXPECT_EQ(s.code(), code) << what << ": " << s.to_string();
    EXPECT_NE(s.message().find(needle), std::string::npos) << what << ": " << s.message();
  };
  refused("arch", [](ModelFile& m) { m.keys["general.architecture"] = [](gguf::Writer& w) { w.put<std::uint32_t>(8), w.str("llama"); }; },
          StatusCode::kUnsupported, "general.architecture = llama");
  refused("missing key", [](ModelFile& m) { m.keys.erase("kimi-linear.kda.head_dim"); }, StatusCode::kInvalidFile,
          "kimi-linear.kda.head_dim is missing");
  refused("head dim", [](ModelFile& m) { m.keys["kimi-linear.kda.head_dim"] = [](gguf::Writer& w) { w.put<std::uint32_t>(4), w.put<std::uint32_t>(96); }; },
          StatusCode::kUnsupported, "kimi-linear.kda.head_dim = 96");
  refused("kv lora", [](ModelFile& m) { m.keys["kimi-linear.attention.kv_lora_rank"] = [](gguf::Writer& w) { w.put<std::uint32_t>(4), w.put<std::uint32_t>(256); }; },
          StatusCode::kUnsupported, "kv_lora_rank = 256");
  refused("layer list", [](ModelFile& m) {
    m.keys["kimi-linear.attention.head_count_kv"] = [](gguf::Writer& w) {
      w.put<std::uint32_t>(9), w.put<std::uint32_t>(5), w.put<std::uint64_t>(3);
      for (int v : {0, 0, 1}) w.put<std::int32_t>(v);
    };
  }, StatusCode::kInvalidFile, "has 3 entries for 4 layers");
  refused("layer list type", [](ModelFile& m) {
    m.keys["kimi-linear.attention.head_count_kv"] = [](gguf::Writer& w) {
      w.put<std::uint32_t>(9), w.put<std::uint32_t>(6), w.put<std::uint64_t>(4);
      for (float v : {0.f, 0.f, 1.f, 0.f}) w.put<float>(v);
    };
  }, StatusCode::kInvalidFile, "is an array of f32");
  refused("eps type", [](ModelFile& m) { m.keys["kimi-linear.attention.layer_norm_rms_epsilon"] = [](gguf::Writer& w) { w.put<std::uint32_t>(4), w.put<std::uint32_t>(1); }; },
          StatusCode::kInvalidFile, "not a float");
  refused("gating", [](ModelFile& m) { m.keys["kimi-linear.expert_gating_func"] = [](gguf::Writer& w) { w.put<std::uint32_t>(4), w.put<std::uint32_t>(4); }; },
          StatusCode::kUnsupported, "expert_gating_func = 4");
}

TEST(GgufModel, EveryWeightHasASource) {
  const Parsed p{ModelFile{}};
  ENCORE_OK(p.configured);
  const TensorArena& weights = p.weights;
  std::vector<TensorSource> plan;
  ENCORE_OK(p.plan(&plan));
  ASSERT_EQ(plan.size(), weights.tensors().size());
  std::map<std::string, const TensorSource*> by;
  for (const TensorSource& s : plan) by[s.name] = &s;
  auto conv = [&](const std::string& n) { return by.at(n)->conversion; };
  EXPECT_EQ(conv("token_embd.weight"), TensorConversion::kToBf16);  // Q4_K in the file, bf16 rows in encore
  EXPECT_EQ(conv("output.weight"), TensorConversion::kCopy);
  EXPECT_EQ(conv("blk.1.attn_q.weight"), TensorConversion::kCopy);
  EXPECT_EQ(conv("blk.1.ssm_conv1d_q.weight"), TensorConversion::kCopy);
  EXPECT_EQ(conv("blk.1.ssm_a_log"), TensorConversion::kLogNegA);
  EXPECT_EQ(by.at("blk.1.ssm_a_log")->from.front()->name, "blk.1.ssm_a");
  EXPECT_EQ(conv("blk.1.ssm_f_b.weight"), TensorConversion::kToBf16);  // Q5_0
  EXPECT_EQ(conv("blk.2.attn_kv_b.weight"), TensorConversion::kKvBFromKAndV);
  ASSERT_EQ(by.at("blk.2.attn_kv_b.weight")->from.size(), 2u);
  EXPECT_EQ(by.at("blk.2.attn_kv_b.weight")->from[1]->name, "blk.2.attn_v_b.weight");
  EXPECT_EQ(conv("blk.1.ffn_gate_inp.weight"), TensorConversion::kToBf16);  // F32 router
  EXPECT_EQ(conv("blk.1.ffn_down_exps.weight"), TensorConversion::kCopy);
  EXPECT_EQ(conv("blk.1.ffn_down_shexp.weight"), TensorConversion::kCopy);
  EXPECT_EQ(conv("blk.0.ffn_down.weight"), TensorConversion::kCopy);
}

TEST(GgufModel, FusedQkvIsSlicedByRows) {
  ModelFile m;
  for (const char* n : {"attn_q.weight", "attn_k.weight", "attn_v.weight"}) m.drop(layer_tensor(1, n));
  m.tensors.push_back({layer_tensor(1, "attn_qkv.weight"), {256, 3 * 1024}, TensorType::kQ4_K});
  const Parsed p{m};
  ENCORE_OK(p.configured);
  std::vector<TensorSource> plan;
  ENCORE_OK(p.plan(&plan));
  for (const TensorSource& s : plan)
    if (s.name == layer_tensor(1, "attn_v.weight")) {
      EXPECT_EQ(s.conversion, TensorConversion::kRowSlice);
      EXPECT_EQ(s.first_row, 2048);
    }
}

TEST(GgufModel, WeightRefusalsNameTheTensor) {
  auto refused = [](const char* what, auto edit, StatusCode code, const char* needle) {
    ModelFile m;
    edit(m);
    const Parsed p{m};
    ENCORE_OK(p.configured);
    std::vector<TensorSource> plan;
    const Status s = p.plan(&plan);
    EXPECT_EQ(s.code(), code) << what << ": " << s.to_string();
    EXPECT_NE(s.message().find(needle), std::string::npos) << what << ": " << s.message();
  };
  refused("Q6_K head", [](ModelFile& m) { m.find("output.weight")->type = TensorType::kQ6_K; }, StatusCode::kUnsupported,
          "tensor output.weight is Q6_K; encore runs it as a Q4_K projection (a file whose projections are all Q4_K works: "
          "llama-quantize --pure IN OUT Q4_K)");
  refused("Q6_K norm source", [](ModelFile& m) { m.find("token_embd.weight")->type = TensorType::kQ6_K; }, StatusCode::kUnsupported,
          "tensor token_embd.weight is Q6_K; encore decodes");
  refused("missing", [](ModelFile& m) { m.drop(layer_tensor(3, "ssm_norm.weight")); }, StatusCode::kInvalidFile,
          "tensor blk.3.ssm_norm.weight is missing");
  refused("shape", [](ModelFile& m) { m.find(layer_tensor(1, "ssm_dt.bias"))->ne = {512}; }, StatusCode::kInvalidFile,
          "tensor blk.1.ssm_dt.bias has shape {512}; the model needs {1024}");
  refused("positive A", [](ModelFile& m) { m.ssm_a = 0.25f; }, StatusCode::kInvalidFile, "every value negative");
  refused("no k_b", [](ModelFile& m) { m.drop(layer_tensor(2, "attn_k_b.weight")); }, StatusCode::kInvalidFile,
          "needs blk.2.attn_k_b.weight and blk.2.attn_v_b.weight");
}

// Asked for every refusal, the plan goes on past the first: each Q6_K projection of a mixed file
// (as llama-quantize's Q4_K_M makes) is named, and nothing is planned.
TEST(GgufModel, EveryRefusalCanBeListed) {
  ModelFile m;
  m.find("output.weight")->type = TensorType::kQ6_K;
  m.find(layer_tensor(1, "ffn_down_exps.weight"))->type = TensorType::kQ6_K;
  m.drop(layer_tensor(3, "ssm_norm.weight"));
  const Parsed p{m};
  ENCORE_OK(p.configured);
  std::vector<TensorSource> plan;
  std::vector<Status> refusals;
  const Status s = p.plan(&plan, &refusals);
  ASSERT_EQ(refusals.size(), 3u);
  EXPECT_EQ(s.message(), refusals[0].message());  // the first, in the arena's order
  std::string all;
  for (const Status& r : refusals) all += r.message() + "\n";
  for (const char* needle : {"output.weight is Q6_K", "blk.1.ffn_down_exps.weight is Q6_K", "blk.3.ssm_norm.weight is missing"})
    EXPECT_NE(all.find(needle), std::string::npos) << needle << " in\n" << all;
  EXPECT_TRUE(plan.empty());
  std::vector<Status> none;
  ENCORE_OK(Parsed{ModelFile{}}.plan(&plan, &none));  // a good file: no refusals, a full plan
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(plan.size(), p.weights.tensors().size());
}

// The conversions on the host: log(-a), W_UK transposed back next to W_UV, fused rows, bf16 rounding.
TEST(GgufModel, ConvertsWeights) {
  ModelFile m;
  m.ssm_a = -0.25f;
  const std::string k_b = layer_tensor(2, "attn_k_b.weight"), v_b = layer_tensor(2, "attn_v_b.weight");
  m.find(k_b)->type = TensorType::kF32;
  m.find(v_b)->type = TensorType::kF32;
  // Integers below 256, exact in bf16: k_b (h, c, n) and v_b (h, v, c) as below.
  auto k_of = [](std::uint64_t h, std::uint64_t c, std::uint64_t n) { return float((h * 31 + n * 3 + c) % 256); };
  auto v_of = [](std::uint64_t h, std::uint64_t v, std::uint64_t c) { return -float((h * 17 + v * 5 + c * 7) % 256); };
  m.f32_values[k_b] = [&](std::uint64_t i) { return k_of(i / (128 * 512), i / 128 % 512, i % 128); };
  m.f32_values[v_b] = [&](std::uint64_t i) { return v_of(i / (512 * 128), i / 512 % 128, i % 512); };
  m.f32_values[layer_tensor(1, "ffn_gate_inp.weight")] = [](std::uint64_t i) { return 1.f + float(i % 7) / 1024.f; };
  const Parsed p{m};
  ENCORE_OK(p.configured);
  const TensorArena& weights = p.weights;
  std::vector<TensorSource> plan;
  ENCORE_OK(p.plan(&plan));
  auto converted = [&](const std::string& name) {
    for (std::size_t i = 0; i < plan.size(); ++i)
      if (plan[i].name == name) {
        std::vector<unsigned char> out(std::size_t(weights.tensors()[i].bytes));
        EXPECT_TRUE(convert_weight(plan[i], weights.tensors()[i], out.data()).ok()) << name;
        return out;
      }
    ADD_FAILURE() << name << " not planned";
    return std::vector<unsigned char>{};
  };
  const std::vector<unsigned char> a = converted(layer_tensor(1, "ssm_a_log"));
  for (std::size_t i = 0; i < a.size() / 4; ++i) {
    float v;
    std::memcpy(&v, a.data() + 4 * i, 4);
    EXPECT_EQ(v, float(std::log(0.25))) << i;
  }
  const std::vector<unsigned char> kv = converted(layer_tensor(2, "attn_kv_b.weight"));  // bf16 [8][256][512]
  auto bf16_at = [&](std::size_t i) {
    __nv_bfloat16 b;
    std::memcpy(&b, kv.data() + 2 * i, 2);
    return __bfloat162float(b);
  };
  for (int h : {0, 7})
    for (int c2 : {0, 3, 511}) {
      for (int n : {0, 5, 127}) EXPECT_EQ(bf16_at((std::size_t(h) * 256 + n) * 512 + c2), k_of(h, c2, n)) << h << " " << n << " " << c2;
      for (int v : {0, 9, 127}) EXPECT_EQ(bf16_at((std::size_t(h) * 256 + 128 + v) * 512 + c2), v_of(h, v, c2)) << h << " " << v;
    }
  const std::vector<unsigned char> router = converted(layer_tensor(1, "ffn_gate_inp.weight"));
  __nv_bfloat16 r3;
  std::memcpy(&r3, router.data() + 2 * 3, 2);
  EXPECT_EQ(__bfloat162float(r3), __bfloat162float(__float2bfloat16_rn(1.f + 3.f / 1024.f)));
}

// The upload: a Pipeline for the file's model, every weight loaded through the pinned chunks,
// and the arena read back equal, byte for byte, to the host conversion.
TEST(GgufModelGpu, LoadsEveryWeightIntoThePipeline) {
  ENCORE_REQUIRE_GPU();
  ModelFile m;
  std::mt19937_64 rng(test::fresh_seed());
  for (FileTensor& t : m.tensors)
    if (t.type == TensorType::kF32 && t.name.find("ssm_a") == std::string::npos)
      m.f32_values[t.name] = [seed = rng()](std::uint64_t i) { return float((seed + i * 2654435761u) % 1000) / 997.f - 0.5f; };
  const Parsed p{m};
  ENCORE_OK(p.configured);
  const ModelConfig& c = p.config;
  BufferOptions o;
  o.max_batch = 2, o.max_slots = 2, o.max_pages = 4, o.max_pages_per_seq = 2;
  std::unique_ptr<Pipeline> pipe;
  ENCORE_OK(Pipeline::create(c, o, pipe));
  std::vector<TensorSource> plan;
  ENCORE_OK(plan_gguf_weights(p.file, c, pipe->weight_layout(), &plan));
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CUDA_OK(cudaMemset(pipe->weights(), 0xA5, std::size_t(pipe->weight_layout().total_bytes())));
  ENCORE_OK(load_gguf_weights(plan, pipe->weight_layout(), pipe->weights(), stream, false));
  std::vector<unsigned char> arena(std::size_t(pipe->weight_layout().total_bytes()));
  CUDA_OK(cudaMemcpy(arena.data(), pipe->weights(), arena.size(), cudaMemcpyDeviceToHost));
  for (std::size_t i = 0; i < plan.size(); ++i) {
    const TensorInfo& w = pipe->weight_layout().tensors()[i];
    std::vector<unsigned char> want(std::size_t(w.bytes));
    ENCORE_OK(convert_weight(plan[i], w, want.data()));
    ASSERT_EQ(std::memcmp(arena.data() + w.offset, want.data(), want.size()), 0) << w.name;
  }
  CUDA_OK(cudaStreamDestroy(stream));
}

// Every weight `path` gives encore (config, plan, host conversion) equals `host`'s, byte for byte
// (A_log through -exp and log, to within an ulp or two).
void expect_loads_to(const std::string& path, const ModelConfig& c, const TensorArena& weights, const std::vector<unsigned char>& host) {
  SCOPED_TRACE(path);
  gguf::File file;
  ENCORE_OK(gguf::File::open(path, file));
  ModelConfig read;
  ENCORE_OK(model_config_from_gguf(file, &read));
  EXPECT_EQ(read.attention, c.attention);
  EXPECT_EQ(read.mlp, c.mlp);
  TensorArena again;
  ENCORE_OK(build_weight_layout(read, again));
  ASSERT_EQ(again.total_bytes(), weights.total_bytes());
  std::vector<TensorSource> plan;
  ENCORE_OK(plan_gguf_weights(file, read, again, &plan));
  for (std::size_t i = 0; i < plan.size(); ++i) {
    const TensorInfo& w = again.tensors()[i];
    std::vector<unsigned char> got(std::size_t(w.bytes));
    ENCORE_OK(convert_weight(plan[i], w, got.data()));
    const unsigned char* want = host.data() + w.offset;
    if (plan[i].conversion == TensorConversion::kLogNegA) {
      for (std::int64_t j = 0; j < w.bytes / 4; ++j) {
        float a, b;
        std::memcpy(&a, got.data() + 4 * j, 4);
        std::memcpy(&b, want + 4 * j, 4);
        EXPECT_NEAR(a, b, 4e-7f) << w.name << "[" << j << "]";
      }
    } else {
      ASSERT_EQ(std::memcmp(got.data(), want, got.size()), 0) << w.name << " (" << to_string(plan[i].conversion) << ")";
    }
  }
}

// save_gguf writes what the reader, the config and the plan read back: every weight byte for byte
// (A_log through -exp and log, to within an ulp or two). gguf-py reads it too, and a copy that
// gguf-py's own writer makes (BF16 widened to F32) loads to the same weights.
TEST(GgufModel, SavedFilesLoadBackToTheSameWeights) {
  ModelConfig c = ModelConfig::tiny_kimi_linear();
  c.name = "roundtrip";
  TensorArena weights;
  ENCORE_OK(build_weight_layout(c, weights));
  std::mt19937_64 rng(test::fresh_seed());
  std::uniform_real_distribution<float> value(-1.f, 1.f);
  std::vector<unsigned char> host(std::size_t(weights.total_bytes()));
  for (const TensorInfo& w : weights.tensors()) {
    unsigned char* p = host.data() + w.offset;
    if (w.dtype == DType::kQ4K) {
      for (std::int64_t i = 0; i < w.bytes; ++i) p[i] = static_cast<unsigned char>(rng());
      for (std::int64_t b = 0; b < w.bytes / 144; ++b)  // finite block scales
        for (int at : {0, 2}) {
          const std::uint16_t h = q4k::float_to_half(value(rng) * 0.01f);
          std::memcpy(p + b * 144 + at, &h, 2);
        }
    } else if (w.dtype == DType::kBf16) {
      for (std::int64_t i = 0; i < w.bytes / 2; ++i) {
        const __nv_bfloat16 b = __float2bfloat16_rn(value(rng));
        std::memcpy(p + 2 * i, &b, 2);
      }
    } else {
      for (std::int64_t i = 0; i < w.bytes / 4; ++i) {
        const float f = w.name.find("ssm_a_log") != std::string::npos ? 2.f * value(rng) - 1.f : value(rng);
        std::memcpy(p + 4 * i, &f, 4);
      }
    }
  }
  const std::string path = ::testing::TempDir() + "encore_roundtrip.gguf";
  ENCORE_OK(save_gguf(path, c, weights, host.data()));
  gguf::File file;
  ENCORE_OK(gguf::File::open(path, file));
  ModelConfig read;
  ENCORE_OK(model_config_from_gguf(file, &read));
  EXPECT_EQ(read.name, "roundtrip");
  EXPECT_EQ(read.hidden, c.hidden);
  EXPECT_EQ(read.vocab, c.vocab);
  EXPECT_EQ(read.kda.gate_rank, c.kda.gate_rank);
  EXPECT_EQ(read.moe.shared_experts, c.moe.shared_experts);
  EXPECT_EQ(read.moe.routed_scale, c.moe.routed_scale);
  EXPECT_EQ(file.tensor("blk.2.attn_k_b.weight")->dims, (std::vector<std::int64_t>{128, 512, 8}));
  EXPECT_EQ(file.tensor("blk.1.ssm_conv1d_k.weight")->dims, (std::vector<std::int64_t>{4, 1, 1024}));
  EXPECT_EQ(file.tensor("blk.1.ssm_a")->dims, (std::vector<std::int64_t>{1, 8}));
  EXPECT_EQ(file.tensor("blk.1.ffn_down_shexp.weight")->dims, (std::vector<std::int64_t>{256, 256}));
  EXPECT_EQ(file.tensor("blk.1.ffn_gate_inp.weight")->type, gguf::TensorType::kF32);
  expect_loads_to(path, c, weights, host);
  // gguf-py (llama.cpp's Python reader) reads the file too, with the same tensors.
  if (std::system("python3 -c 'import gguf' >/dev/null 2>&1") == 0) {
    const std::string check = "python3 -c \"import gguf, sys; r = gguf.GGUFReader('" + path + "'); "
                              "f = r.get_field('general.architecture'); "
                              "sys.exit(0 if len(r.tensors) == " + std::to_string(file.tensors().size()) +
                              " and bytes(f.parts[f.data[0]]) == b'kimi-linear' else 1)\"";
    EXPECT_EQ(std::system(check.c_str()), 0) << check;
    const std::string copy = ::testing::TempDir() + "encore_roundtrip_gguf_py.gguf";
    const std::string script = std::string(__FILE__).substr(0, std::string(__FILE__).rfind('/')) + "/gguf_py_rewrite.py";
    const std::string rewrite = "python3 " + script + " " + path + " " + copy;
    ASSERT_EQ(std::system(rewrite.c_str()), 0) << rewrite;
    gguf::File rewritten;
    ENCORE_OK(gguf::File::open(copy, rewritten));
    EXPECT_EQ(rewritten.tensor("token_embd.weight")->type, gguf::TensorType::kF32);  // was BF16
    expect_loads_to(copy, c, weights, host);
    std::remove(copy.c_str());
  } else {
    std::printf("gguf-py not importable (pip install gguf): its reader and writer not cross-checked\n");
  }
  std::remove(path.c_str());
}

}  // namespace
}  // namespace encore::pipeline
