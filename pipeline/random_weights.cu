// Device generators behind fill_random_weights (random_weights.h): one counter-based hash per
// element (splitmix64 of seed, tensor index and element index), so the values do not depend on
// the launch geometry.
#include <cmath>
#include <string>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <encore/pipeline/random_weights.h>
#include <encore/q4k.h>

#include "common/cuda_check.h"
#include "common/block.h"

namespace encore::pipeline {
namespace {

enum class Dist : int { kUniform, kOnePlusUniform, kLnUniform1To16, kDtBias };

__device__ __forceinline__ std::uint64_t mix(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
__device__ __forceinline__ std::uint64_t element_hash(std::uint64_t key, std::int64_t i) { return mix(key ^ mix(std::uint64_t(i))); }
__device__ __forceinline__ float unit(std::uint64_t h) { return float(h >> 40) * (1.f / 16777216.f); }  // [0, 1)

__device__ float draw(Dist dist, float a, std::uint64_t h) {
  const float u = unit(h);
  switch (dist) {
    case Dist::kUniform: return a * (2.f * u - 1.f);
    case Dist::kOnePlusUniform: return 1.f + a * (2.f * u - 1.f);
    case Dist::kLnUniform1To16: return logf(1.f + 15.f * u);
    case Dist::kDtBias: {
      const float dt = expf(logf(1e-3f) + u * (logf(1e-1f) - logf(1e-3f)));
      return logf(expm1f(dt));  // softplus^-1
    }
  }
  return 0.f;
}

template <class T>
__global__ void fill_dense_kernel(T* out, std::int64_t n, std::uint64_t key, Dist dist, float a) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x) {
    const float v = draw(dist, a, element_hash(key, i));
    if constexpr (sizeof(T) == 2) out[i] = __float2bfloat16_rn(v);
    else out[i] = v;
  }
}

// One thread per 16-byte chunk of a block: chunk 0 = d, dmin and the 12 scale bytes, 1..8 = codes.
__global__ void fill_q4k_kernel(uint4* out, std::int64_t chunks, std::uint64_t key, float d) {
  for (std::int64_t c = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; c < chunks; c += std::int64_t(gridDim.x) * blockDim.x) {
    const std::uint64_t h0 = element_hash(key, 2 * c), h1 = element_hash(key, 2 * c + 1);
    uint4 v = make_uint4(std::uint32_t(h0), std::uint32_t(h0 >> 32), std::uint32_t(h1), std::uint32_t(h1 >> 32));
    if (c % 9 == 0) {
      const std::uint32_t dh = __half_as_ushort(__float2half_rn(d)), mh = __half_as_ushort(__float2half_rn(7.5f * d));
      v.x = dh | (mh << 16);
    }
    out[c] = v;
  }
}

bool ends_with(const std::string& s, const char* suffix) {
  const std::string t(suffix);
  return s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
}
bool contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

int grid_for(std::int64_t items) {
  const std::int64_t blocks = (items + kBlockThreads - 1) / kBlockThreads;
  return int(std::min<std::int64_t>(std::max<std::int64_t>(blocks, 1), 8LL * detail::sm_count()));
}

}  // namespace

Status fill_random_weights(const TensorArena& layout, void* base, std::uint64_t seed, cudaStream_t stream) {
  ENCORE_RETURN_IF_ERROR(detail::check_pointer("fill_random_weights", base, 16, "base"));
  char* bytes = static_cast<char*>(base);
  for (std::size_t t = 0; t < layout.tensors().size(); ++t) {
    const TensorInfo& info = layout.tensors()[t];
    const std::uint64_t key = seed * 0x100000001B3ull + t;
    const std::int64_t last = info.dims.empty() ? 1 : info.dims.back();
    if (info.dtype == DType::kQ4K) {
      const float d = 1.f / (256.f * std::sqrt(float(last)));
      const std::int64_t chunks = info.bytes / 16;
      fill_q4k_kernel<<<grid_for(chunks), kBlockThreads, 0, stream>>>(reinterpret_cast<uint4*>(bytes + info.offset), chunks, key, d);
    } else if (info.dtype == DType::kBf16 || info.dtype == DType::kF32) {
      Dist dist = Dist::kUniform;
      float a = std::sqrt(3.f / float(last));
      if (ends_with(info.name, "norm.weight")) dist = Dist::kOnePlusUniform, a = 0.17f;
      else if (contains(info.name, "ssm_conv1d")) a = 0.87f;
      else if (ends_with(info.name, "ssm_a_log")) dist = Dist::kLnUniform1To16;
      else if (ends_with(info.name, "ssm_dt.bias")) dist = Dist::kDtBias;
      else if (ends_with(info.name, "exp_probs_b.bias")) a = 0.5f;
      else if (info.name == "token_embd.weight") a = 1.73f;
      const std::int64_t n = info.bytes / (info.dtype == DType::kBf16 ? 2 : 4);
      if (info.dtype == DType::kBf16)
        fill_dense_kernel<<<grid_for(n), kBlockThreads, 0, stream>>>(reinterpret_cast<__nv_bfloat16*>(bytes + info.offset), n, key, dist, a);
      else
        fill_dense_kernel<<<grid_for(n), kBlockThreads, 0, stream>>>(reinterpret_cast<float*>(bytes + info.offset), n, key, dist, a);
    } else {
      ENCORE_CUDA_TRY(cudaMemsetAsync(bytes + info.offset, 0, std::size_t(info.bytes), stream));
    }
    ENCORE_RETURN_IF_ERROR(detail::check_launch("fill_random_weights"));
  }
  return {};
}

}  // namespace encore::pipeline
