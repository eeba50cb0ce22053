// Synthetic weights drawn on the host (random_weights.h): the device fill's distributions.
#include <cmath>
#include <cstring>
#include <random>
#include <string>

#include <cuda_bf16.h>

#include <encore/pipeline/random_weights.h>
#include <encore/q4k.h>

namespace encore::pipeline {
namespace {

bool ends_with(const std::string& s, const char* suffix) {
  const std::string t(suffix);
  return s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
}

// One value of a bf16 / fp32 tensor from s in [-1, 1) and x in [0, 1), by the tensor's role.
float value_for(const std::string& name, std::int64_t fan_in, float x, float s) {
  if (ends_with(name, "norm.weight")) return 1.f + 0.17f * s;
  if (name.find("ssm_conv1d") != std::string::npos) return 0.87f * s;
  if (ends_with(name, "ssm_a_log")) return std::log(1.f + 15.f * x);
  if (ends_with(name, "ssm_dt.bias"))
    return std::log(std::expm1(std::exp(std::log(1e-3f) + x * (std::log(1e-1f) - std::log(1e-3f)))));
  if (ends_with(name, "exp_probs_b.bias")) return 0.5f * s;
  if (name == "token_embd.weight") return 1.73f * s;
  return std::sqrt(3.f / float(fan_in)) * s;
}

}  // namespace

void fill_random_weights_host(const TensorArena& layout, void* host_base, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> unit(0.f, 1.f);
  for (const TensorInfo& t : layout.tensors()) {
    unsigned char* p = static_cast<unsigned char*>(host_base) + t.offset;
    const std::int64_t k = t.dims.back();
    if (t.dtype == DType::kQ4K) {  // random codes and scales; d = 1 / (256 sqrt(K)), dmin = 7.5 d
      for (std::int64_t i = 0; i < t.bytes; i += 8) {  // 8 random bytes per draw (Q4_K tensors are 144-byte blocks)
        const std::uint64_t bits = rng();
        std::memcpy(p + i, &bits, 8);
      }
      const float d = 1.f / (256.f * std::sqrt(float(k)));
      const std::uint16_t dh = q4k::float_to_half(d), mh = q4k::float_to_half(7.5f * d);
      for (std::int64_t b = 0; b < t.bytes / q4k::kBlockBytes; ++b) {
        std::memcpy(p + b * q4k::kBlockBytes, &dh, 2);
        std::memcpy(p + b * q4k::kBlockBytes + 2, &mh, 2);
      }
      continue;
    }
    const bool bf16 = t.dtype == DType::kBf16;
    for (std::int64_t i = 0; i < t.bytes / (bf16 ? 2 : 4); ++i) {
      const float x = unit(rng);
      const float v = value_for(t.name, k, x, 2.f * x - 1.f);
      if (bf16) {
        const __nv_bfloat16 b = __float2bfloat16_rn(v);
        std::memcpy(p + 2 * i, &b, 2);
      } else {
        std::memcpy(p + 4 * i, &v, 4);
      }
    }
  }
}

}  // namespace encore::pipeline
