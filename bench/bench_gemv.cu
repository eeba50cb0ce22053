// Q4_K GEMV family at Kimi-Linear-48B-A3B and Llama-3-8B shapes, batch 1/4/8/16 (and 32 where one
// launch takes it), weights rotated beyond L2; side by side: cuBLASLt bf16 GEMV of the same shape and the unfused chains
// (RMSNorm kernel + GEMV; gate GEMV + up GEMV + SiLU-mul).
#include <encore/ops/q4k_gemv.h>

#include <cublasLt.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "bench_util.h"

namespace encore::bench {
namespace {

struct Shape {
  const char* name;
  std::int64_t n, k;
  bool gate_up;  // also bench the fused gate/up op at this shape
};

const Shape kShapes[] = {
    {"kimi_qkv_4096x2304", 4096, 2304, false},   {"kimi_oproj_2304x4096", 2304, 4096, false},
    {"kimi_expert_up_1024x2304", 1024, 2304, true}, {"kimi_expert_down_2304x1024", 2304, 1024, false},
    {"kimi_dense_up_9216x2304", 9216, 2304, true},  {"kimi_lm_head_163840x2304", 163840, 2304, false},
    {"kimi_kda_in_proj_12576x2304", 12576, 2304, false},  // q | k | v | f_a | g_a | b rows of a KDA layer
    {"llama_4096x4096", 4096, 4096, false},          {"llama_up_14336x4096", 14336, 4096, true},
    {"llama_down_4096x14336", 4096, 14336, false},
};
const int kBatches[] = {1, 4, 8, 16};
constexpr int kWideBatch = ops::kMaxGemvBatch;  // (shapes whose K allows it: ops::q4k_gemv_max_batch)

// ---- baselines' helper kernels ----------------------------------------------------------------

__global__ void rmsnorm_kernel(const float* x, const float* gamma, float* out, int k, float eps) {
  const float* row = x + blockIdx.x * std::int64_t(k);
  float ss = 0.f;
  for (int j = threadIdx.x; j < k; j += blockDim.x) ss += row[j] * row[j];
  __shared__ float partial[32];
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xFFFFFFFFu, ss, o);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = ss;
  __syncthreads();
  float total = 0.f;
  for (int w = 0; w < blockDim.x / 32; ++w) total += partial[w];
  const float r = rsqrtf(total / k + eps);
  for (int j = threadIdx.x; j < k; j += blockDim.x) out[blockIdx.x * std::int64_t(k) + j] = row[j] * r * gamma[j];
}

__global__ void silu_mul_kernel(const float* g, const float* u, float* h, std::int64_t count) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < count; i += std::int64_t(gridDim.x) * blockDim.x)
    h[i] = g[i] / (1.f + expf(-g[i])) * u[i];
}

__global__ void to_bf16_kernel(const float* in, __nv_bfloat16* out, std::int64_t count) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < count; i += std::int64_t(gridDim.x) * blockDim.x)
    out[i] = __float2bfloat16_rn(in[i]);
}

void check(Status s) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", s.to_string().c_str());
    std::exit(2);
  }
}

__global__ void fix_scales(q4k::Block* b, std::size_t count) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < count; i += std::size_t(gridDim.x) * blockDim.x) {
    b[i].d = 0x1400;     // ~0.001
    b[i].dmin = 0x1800;  // ~0.002
  }
}

// Rotated copies of random Q4_K weights with small finite scales.
struct Q4kWeights {
  int copies;
  std::size_t bytes;
  DeviceMemory mem;
  Q4kWeights(std::int64_t n, std::int64_t k, int copies_, std::uint64_t seed)
      : copies(copies_), bytes(std::size_t(q4k::row_bytes(k)) * n), mem(bytes * copies_) {
    fill_random_bytes(mem.as(), bytes * copies, seed);
    // Random fp16 d/dmin can be inf/NaN: overwrite the two scale words of every block.
    const std::size_t blocks = bytes * copies / q4k::kBlockBytes;
    fix_scales<<<1024, 256>>>(mem.as<q4k::Block>(), blocks);
    BENCH_CUDA(cudaGetLastError());
  }
  const q4k::Block* copy(int i) const { return reinterpret_cast<const q4k::Block*>(mem.as<char>() + bytes * (i % copies)); }
};

struct Activations {
  DeviceMemory x, gamma, y, y2, tmp;
  Activations(std::int64_t n, std::int64_t k, int batch)
      : x(sizeof(float) * k * batch), gamma(sizeof(float) * k), y(sizeof(float) * n * batch), y2(sizeof(float) * n * batch),
        tmp(sizeof(float) * std::max(n, k) * batch) {
    fill_random_floats(x.as<float>(), k * batch, 7);
    fill_random_floats(gamma.as<float>(), k, 8, 0.9f, 1.1f);
  }
};

// The launch options for `core`, with the activation image (GemvLaunch::act_image) in `image`
// when it is given.
struct LaunchOf {
  DeviceMemory image;
  ops::GemvLaunch launch;
  LaunchOf(ops::GemvCore core, bool with_image) : image(with_image ? ops::kGemvActImageBytes : 16) {
    launch.core = core;
    if (with_image) launch.act_image = image.as(), launch.act_image_bytes = ops::kGemvActImageBytes;
    // Tensor-core cores: the K parts per row group, forced (1, 2, 4, 8) to compare the planner's choice.
    if (const char* parts = std::getenv("ENCORE_BENCH_K_PARTS")) launch.mma_k_parts = std::atoi(parts);
  }
};

// y = W x with the plain op (also the second half of the unfused chains).
void plain_gemv(const q4k::Block* w, const float* x, float* y, const Shape& s, int batch, cudaStream_t stream,
                const ops::GemvLaunch& launch = {}) {
  ops::Q4kGemvParams p;
  p.weight = w;
  p.x = x;
  p.y = y;
  p.n = s.n;
  p.k = s.k;
  p.batch = batch;
  check(ops::q4k_gemv(p, stream, launch));
}

void bench_q4k(benchmark::State& state, Shape s, int batch, bool rotate, ops::GemvCore core, bool image) {
  const double bytes = double(q4k::row_bytes(s.k)) * s.n;
  const int copies = rotate ? rotation_count(std::size_t(bytes)) : 1;
  Q4kWeights w(s.n, s.k, copies, 1);
  Activations a(s.n, s.k, batch);
  const LaunchOf l(core, image);
  time_graph(state, [&](int i, cudaStream_t st) { plain_gemv(w.copy(i), a.x.as<float>(), a.y.as<float>(), s, batch, st, l.launch); },
             graph_calls(copies), bytes);
}

void bench_rmsnorm(benchmark::State& state, Shape s, int batch, bool fused, ops::GemvCore core, bool image) {
  const double bytes = double(q4k::row_bytes(s.k)) * s.n;
  const int copies = rotation_count(std::size_t(bytes));
  Q4kWeights w(s.n, s.k, copies, 2);
  Activations a(s.n, s.k, batch);
  const LaunchOf l(core, image);
  time_graph(state, [&](int i, cudaStream_t st) {
    if (fused) {
      ops::RmsNormQ4kGemvParams p;
      p.weight = w.copy(i);
      p.x = a.x.as<float>();
      p.gamma = a.gamma.as<float>();
      p.y = a.y.as<float>();
      p.n = s.n;
      p.k = s.k;
      p.batch = batch;
      check(ops::rmsnorm_q4k_gemv(p, st, l.launch));
    } else {
      rmsnorm_kernel<<<batch, 256, 0, st>>>(a.x.as<float>(), a.gamma.as<float>(), a.tmp.as<float>(), int(s.k), 1e-5f);
      plain_gemv(w.copy(i), a.tmp.as<float>(), a.y.as<float>(), s, batch, st, l.launch);
    }
  }, graph_calls(copies), bytes);
}

void bench_gate_up(benchmark::State& state, Shape s, int batch, bool fused, ops::GemvCore core) {
  const double bytes = 2.0 * q4k::row_bytes(s.k) * s.n;
  const int copies = rotation_count(std::size_t(bytes));
  Q4kWeights gate(s.n, s.k, copies, 3), up(s.n, s.k, copies, 4);
  Activations a(s.n, s.k, batch);
  time_graph(state, [&](int i, cudaStream_t st) {
    if (fused) {
      ops::GateUpQ4kGemvParams p;
      p.gate = gate.copy(i);
      p.up = up.copy(i);
      p.x = a.x.as<float>();
      p.gamma = a.gamma.as<float>();
      p.h = a.y.as<float>();
      p.n = s.n;
      p.k = s.k;
      p.batch = batch;
      check(ops::gate_up_q4k_gemv(p, st, {true, core}));
    } else {
      rmsnorm_kernel<<<batch, 256, 0, st>>>(a.x.as<float>(), a.gamma.as<float>(), a.tmp.as<float>(), int(s.k), 1e-5f);
      plain_gemv(gate.copy(i), a.tmp.as<float>(), a.y.as<float>(), s, batch, st);
      plain_gemv(up.copy(i), a.tmp.as<float>(), a.y2.as<float>(), s, batch, st);
      silu_mul_kernel<<<264, 256, 0, st>>>(a.y.as<float>(), a.y2.as<float>(), a.y.as<float>(), s.n * batch);
    }
  }, graph_calls(copies), bytes);
}

// cuBLASLt bf16 GEMV of the same shape: y[N x B] = W[N x K] x[K x B], fp32 out.
void bench_cublaslt(benchmark::State& state, Shape s, int batch) {
  const double bytes = 2.0 * s.n * s.k;
  const int copies = rotation_count(std::size_t(bytes));
  DeviceMemory w(std::size_t(bytes) * copies), xf(sizeof(float) * s.k * batch), x(2 * s.k * batch), y(4 * s.n * batch);
  fill_random_floats(xf.as<float>(), s.k * batch, 5);
  to_bf16_kernel<<<256, 256>>>(xf.as<float>(), x.as<__nv_bfloat16>(), s.k * batch);
  {
    DeviceMemory tmp(4 * std::size_t(s.n) * s.k);
    fill_random_floats(tmp.as<float>(), s.n * s.k, 6, -0.05f, 0.05f);
    for (int c = 0; c < copies; ++c)
      to_bf16_kernel<<<1024, 256>>>(tmp.as<float>(), w.as<__nv_bfloat16>() + std::size_t(c) * s.n * s.k, s.n * s.k);
  }
  cublasLtHandle_t lt;
  cublasLtCreate(&lt);
  cublasLtMatmulDesc_t desc;
  cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta));
  cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb));
  cublasLtMatrixLayout_t la, lb, lc;
  cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, s.k, s.n, s.k);
  cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, s.k, batch, s.k);
  cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, s.n, batch, s.n);
  const std::size_t workspace_bytes = 32 << 20;
  DeviceMemory workspace(workspace_bytes);
  cublasLtMatmulPreference_t pref;
  cublasLtMatmulPreferenceCreate(&pref);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes, sizeof(workspace_bytes));
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, 1, &heuristic, &found);
  if (found == 0) {
    state.SkipWithError("cuBLASLt found no algorithm");
  } else {
    const float alpha = 1.f, beta = 0.f;
    time_graph(state, [&](int i, cudaStream_t st) {
      const auto* wi = w.as<__nv_bfloat16>() + std::size_t(i % copies) * s.n * s.k;
      cublasStatus_t r = cublasLtMatmul(lt, desc, &alpha, wi, la, x.as<__nv_bfloat16>(), lb, &beta, y.as<float>(), lc, y.as<float>(), lc,
                                        &heuristic.algo, workspace.as(), workspace_bytes, st);
      if (r != CUBLAS_STATUS_SUCCESS) std::fprintf(stderr, "cublasLtMatmul failed: %d\n", int(r));
    }, graph_calls(copies), bytes);
  }
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(lc);
  cublasLtMatmulDescDestroy(desc);
  cublasLtDestroy(lt);
}

[[maybe_unused]] const bool registered = [] {
  for (const Shape& s : kShapes)
    for (int b : kBatches) {
      const std::string tail = std::string(s.name) + "/b" + std::to_string(b);
      benchmark::RegisterBenchmark(("gemv/q4k/" + tail).c_str(), bench_q4k, s, b, true, ops::GemvCore::kAuto, false)->UseManualTime();
      benchmark::RegisterBenchmark(("gemv/rmsnorm_q4k_fused/" + tail).c_str(), bench_rmsnorm, s, b, true, ops::GemvCore::kAuto, false)->UseManualTime();
      benchmark::RegisterBenchmark(("gemv/rmsnorm_q4k_unfused/" + tail).c_str(), bench_rmsnorm, s, b, false, ops::GemvCore::kAuto, false)->UseManualTime();
      if (s.gate_up) {
        benchmark::RegisterBenchmark(("gemv/gate_up_q4k_fused/" + tail).c_str(), bench_gate_up, s, b, true, ops::GemvCore::kAuto)->UseManualTime();
        benchmark::RegisterBenchmark(("gemv/gate_up_q4k_unfused/" + tail).c_str(), bench_gate_up, s, b, false, ops::GemvCore::kAuto)->UseManualTime();
      }
      benchmark::RegisterBenchmark(("gemv/cublaslt_bf16/" + tail).c_str(), bench_cublaslt, s, b)->UseManualTime();
      if (b >= ops::kGemvMmaMinBatch && !s.gate_up) {  // with the activation image (the fp16 core's launches)
        benchmark::RegisterBenchmark(("gemv/q4k_image/" + tail).c_str(), bench_q4k, s, b, true, ops::GemvCore::kAuto, true)->UseManualTime();
        benchmark::RegisterBenchmark(("gemv/rmsnorm_q4k_fused_image/" + tail).c_str(), bench_rmsnorm, s, b, true, ops::GemvCore::kAuto, true)
            ->UseManualTime();
      }
      if (b >= ops::kGemvMmaMinBatch) {  // the other cores where the fp16 mma core is the default
        for (auto [suffix, core] : {std::pair{"_dp4a", ops::GemvCore::kDp4a}, std::pair{"_int8", ops::GemvCore::kMma}}) {
          const std::string name = std::string(suffix) + "/" + tail;
          benchmark::RegisterBenchmark(("gemv/q4k" + name).c_str(), bench_q4k, s, b, true, core, false)->UseManualTime();
          benchmark::RegisterBenchmark(("gemv/rmsnorm_q4k_fused" + name).c_str(), bench_rmsnorm, s, b, true, core, false)->UseManualTime();
          if (s.gate_up)
            benchmark::RegisterBenchmark(("gemv/gate_up_q4k_fused" + name).c_str(), bench_gate_up, s, b, true, core)->UseManualTime();
        }
      }
    }
  // The fp16 core's 32-token tier, where one launch takes 32 rows (against two of 16 above).
  for (const Shape& s : kShapes) {
    if (ops::q4k_gemv_max_batch(s.k, 1) < kWideBatch) continue;
    const std::string tail = std::string(s.name) + "/b" + std::to_string(kWideBatch);
    for (bool image : {false, true}) {
      const std::string suffix = image ? "_image/" : "/";
      benchmark::RegisterBenchmark(("gemv/q4k" + suffix + tail).c_str(), bench_q4k, s, kWideBatch, true, ops::GemvCore::kAuto, image)
          ->UseManualTime();
      benchmark::RegisterBenchmark(("gemv/rmsnorm_q4k_fused" + suffix + tail).c_str(), bench_rmsnorm, s, kWideBatch, true,
                                   ops::GemvCore::kAuto, image)->UseManualTime();
    }
    benchmark::RegisterBenchmark(("gemv/cublaslt_bf16/" + tail).c_str(), bench_cublaslt, s, kWideBatch)->UseManualTime();
  }
  // llama.cpp's perf shape with the weights left L2-resident, as test-backend-ops times it.
  const Shape& llama_down = *std::find_if(std::begin(kShapes), std::end(kShapes),
                                          [](const Shape& s) { return std::string(s.name) == "llama_down_4096x14336"; });
  for (int b : {1, 8})
    benchmark::RegisterBenchmark(("gemv/q4k_not_rotated/" + std::string(llama_down.name) + "/b" + std::to_string(b)).c_str(),
                                 bench_q4k, llama_down, b, false, ops::GemvCore::kAuto, false)->UseManualTime();
  return true;
}();

}  // namespace
}  // namespace encore::bench
