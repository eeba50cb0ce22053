// MoE benchmarks: the Kimi-Linear MoE layer (hidden 2304, 256 experts + 1 shared, top-8, width
// 1024) at B = 1, 8, 32, 64: router alone, experts alone, router + experts (from a normalised h, and
// from the raw residual stream with the layer's RMSNorm fused into both ops); the naive chain (one
// gate/up and one down GEMV launch per used expert, ops::gate_up_q4k_gemv / ops::q4k_gemv); and
// the GGML MUL_MAT_ID reference shape (128 experts, top-8, 768 x 2048, no shared expert); and a
// probe that reads the used experts' bytes with no math (the ceiling of that memory pattern).
// Bytes = router weights (where timed) + the Q4_K bytes of the experts actually used, averaged
// over the rotation; every call reads a different routing and one of three weight copies, so the
// working set is far beyond L2.
#include <algorithm>
#include <cstdio>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include <cub/block/block_reduce.cuh>
#include <cuda_bf16.h>

#include <encore/ops/moe.h>
#include <encore/ops/q4k_gemv.h>

#include "bench_util.h"
#include "common/block.h"
#include "common/pdl.cuh"
#include "common/launch.h"

namespace encore::bench {
namespace {

constexpr int kCalls = 16;       // distinct inputs per captured graph
constexpr int kWeightCopies = 3;

__global__ void to_bf16_kernel(const float* in, __nv_bfloat16* out, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x)
    out[i] = __float2bfloat16(in[i]);
}

// h[row] = rmsnorm(raw[row]) * gamma (eps 1e-5): one block of 256 threads per row (setup only).
__global__ void rms_norm_rows_kernel(const float* raw, const float* gamma, int hidden, float* h) {
  using Reduce = cub::BlockReduce<float, 256>;
  __shared__ typename Reduce::TempStorage temp;
  __shared__ float inv_rms;
  const float* x = raw + std::size_t(blockIdx.x) * hidden;
  float ss = 0.f;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) ss += x[i] * x[i];
  const float total = Reduce(temp).Sum(ss);
  if (threadIdx.x == 0) inv_rms = rsqrtf(total / float(hidden) + 1e-5f);
  __syncthreads();
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) h[std::size_t(blockIdx.x) * hidden + i] = x[i] * inv_rms * gamma[i];
}

// Random Q4_K blocks with sane d/dmin (random fp16 bytes could be inf/NaN).
__global__ void fix_scales_kernel(q4k::Block* blocks, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x) {
    blocks[i].d = 0x0C00 | (blocks[i].d & 0x01FF);     // ~2.4e-4 .. 3.6e-4
    blocks[i].dmin = 0x0800 | (blocks[i].dmin & 0x01FF);
  }
}

struct Shape {
  int num_experts, num_shared, top_k, hidden, inter;
  std::size_t matrix_bytes() const { return std::size_t(hidden / 256) * 144 * inter; }
  std::size_t expert_bytes() const { return 3 * matrix_bytes(); }
};
constexpr Shape kKimi{256, 1, 8, 2304, 1024};
constexpr Shape kGgml{128, 0, 8, 2048, 768};

struct Model {
  Shape s;
  q4k::Block* gate[kWeightCopies];
  q4k::Block* up[kWeightCopies];
  q4k::Block* down[kWeightCopies];
  __nv_bfloat16* router;
  float* bias;
  float* norm;  // the layer's RMSNorm weight (fused-norm variant)
};

Model& model(const Shape& s) {
  static std::vector<std::pair<const Shape*, Model*>> cache;
  for (auto& [shape, m] : cache)
    if (shape->num_experts == s.num_experts && shape->hidden == s.hidden) return *m;
  Model* m = new Model{s, {}, {}, {}, nullptr, nullptr, nullptr};
  const std::size_t stack = (s.num_experts + s.num_shared) * s.matrix_bytes();
  for (int c = 0; c < kWeightCopies; ++c) {
    q4k::Block** mats[3] = {&m->gate[c], &m->up[c], &m->down[c]};
    for (int k = 0; k < 3; ++k) {
      *mats[k] = static_cast<q4k::Block*>(device_alloc(stack));
      fill_random_bytes(*mats[k], stack, 100 * c + k + 1);
      fix_scales_kernel<<<1024, 256>>>(*mats[k], stack / 144);
    }
  }
  const std::size_t rn = std::size_t(s.num_experts) * s.hidden;
  float* tmp = static_cast<float*>(device_alloc(rn * 4));
  fill_random_floats(tmp, rn, 7, -0.02f, 0.02f);
  m->router = static_cast<__nv_bfloat16*>(device_alloc(rn * 2));
  to_bf16_kernel<<<1024, 256>>>(tmp, m->router, rn);
  m->bias = static_cast<float*>(device_alloc(s.num_experts * 4));
  fill_random_floats(m->bias, s.num_experts, 8, -0.05f, 0.05f);
  m->norm = static_cast<float*>(device_alloc(std::size_t(s.hidden) * 4));
  fill_random_floats(m->norm, s.hidden, 9, 0.5f, 1.5f);
  BENCH_CUDA(cudaDeviceSynchronize());
  cache.push_back({&s, m});
  return *m;
}

// Per call: its own raw input, its normalised h, x, routing outputs and workspaces.
struct Step {
  float* raw;  // the layer input before its RMSNorm (fused-norm variant)
  float* h;    // rmsnorm(raw) * the model's norm weight
  float* x;
  int* ids;
  float* weights;
  void* router_ws;
  std::int32_t* router_counter;  // the one-kernel router's (zero between calls)
  void* experts_ws;
  std::vector<int> host_ids;
};

ops::MoeRoutingConfig routing_for(const Shape& s) {
  ops::MoeRoutingConfig c = s.num_shared ? ops::MoeRoutingConfig::kimi_linear() : ops::MoeRoutingConfig::qwen3_moe();
  c.num_experts = s.num_experts;
  c.top_k = s.top_k;
  return c;
}

ops::MoeRouterParams router_params(const Model& m, const Step& st, int batch) {
  ops::MoeRouterParams p;
  p.config = routing_for(m.s);
  p.weight = m.router;
  p.weight_dtype = ops::MoeRouterDtype::kBf16;
  p.bias = m.s.num_shared ? m.bias : nullptr;
  p.h = st.h;
  p.hidden = m.s.hidden;
  p.batch = batch;
  p.topk_ids = st.ids;
  p.topk_weights = st.weights;
  p.workspace = st.router_ws;
  p.workspace_bytes = ops::moe_router_workspace_bytes(batch, m.s.num_experts, m.s.hidden);
  return p;
}

ops::MoeExpertsParams experts_params(const Model& m, const Step& st, int batch, int copy) {
  ops::MoeExpertsParams p;
  p.gate = m.gate[copy];
  p.up = m.up[copy];
  p.down = m.down[copy];
  p.num_experts = m.s.num_experts;
  p.num_shared = m.s.num_shared;
  p.top_k = m.s.top_k;
  p.hidden = m.s.hidden;
  p.inter = m.s.inter;
  p.batch = batch;
  p.max_batch = ops::kMaxMoeBatch;
  p.h = st.h;
  p.h_settled = true;  // after the router, or static (experts alone)
  p.x = st.x;
  p.topk_ids = st.ids;
  p.topk_weights = st.weights;
  p.workspace = st.experts_ws;
  p.workspace_bytes = ops::moe_experts_workspace_bytes(ops::kMaxMoeBatch, m.s.num_experts, m.s.num_shared, m.s.top_k, m.s.hidden, m.s.inter);
  return p;
}

// The experts a step uses: its routed ids and the shared experts (ids num_experts ..).
std::set<int> used_experts(const Shape& shape, const Step& st) {
  std::set<int> used(st.host_ids.begin(), st.host_ids.end());
  for (int sh = 0; sh < shape.num_shared; ++sh) used.insert(shape.num_experts + sh);
  return used;
}

// kCalls steps with random h; routing from the real router (run once here), so the timed graphs
// see the routing they produce. Returns the mean bytes of used experts per call.
std::vector<Step>& steps(const Model& m, int batch, double& expert_bytes) {
  static std::vector<std::pair<std::pair<const Model*, int>, std::vector<Step>*>> cache;
  std::vector<Step>* found = nullptr;
  for (auto& [key, v] : cache)
    if (key.first == &m && key.second == batch) found = v;
  if (!found) {
    found = new std::vector<Step>(kCalls);
    for (int i = 0; i < kCalls; ++i) {
      Step& st = (*found)[i];
      st.raw = static_cast<float*>(device_alloc(std::size_t(batch) * m.s.hidden * 4));
      st.h = static_cast<float*>(device_alloc(std::size_t(batch) * m.s.hidden * 4));
      st.x = static_cast<float*>(device_alloc(std::size_t(batch) * m.s.hidden * 4));
      fill_random_floats(st.raw, std::size_t(batch) * m.s.hidden, 1000 + i);
      rms_norm_rows_kernel<<<batch, 256>>>(st.raw, m.norm, m.s.hidden, st.h);
      BENCH_CUDA(cudaGetLastError());
      fill_random_floats(st.x, std::size_t(batch) * m.s.hidden, 2000 + i);
      st.ids = static_cast<int*>(device_alloc(std::size_t(batch) * m.s.top_k * 4));
      st.weights = static_cast<float*>(device_alloc(std::size_t(batch) * m.s.top_k * 4));
      st.router_ws = device_alloc(ops::moe_router_workspace_bytes(batch, m.s.num_experts, m.s.hidden));
      st.router_counter = static_cast<std::int32_t*>(device_alloc(sizeof(std::int32_t)));
      BENCH_CUDA(cudaMemset(st.router_counter, 0, sizeof(std::int32_t)));
      st.experts_ws = device_alloc(ops::moe_experts_workspace_bytes(ops::kMaxMoeBatch, m.s.num_experts, m.s.num_shared, m.s.top_k, m.s.hidden, m.s.inter));
      throw_if_error(ops::moe_router(router_params(m, st, batch), nullptr));
      st.host_ids.resize(std::size_t(batch) * m.s.top_k);
      BENCH_CUDA(cudaMemcpy(st.host_ids.data(), st.ids, st.host_ids.size() * 4, cudaMemcpyDeviceToHost));
    }
    cache.push_back({{&m, batch}, found});
  }
  double total = 0;
  for (const Step& st : *found) total += double(used_experts(m.s, st).size());
  expert_bytes = total / kCalls * m.s.expert_bytes();
  return *found;
}

double router_bytes(const Shape& s) { return double(s.num_experts) * s.hidden * 2; }

// kLayerNorm: the layer as the decode pipeline runs it, the RMSNorm fused into the router and the
// experts, which read the raw input (the pipeline passes h = x; here it stays apart from x, or the
// replays' in-place adds would drift every token towards the same routing). Its h is the raw
// input the other parts see normalised, so both route alike (up to fp32 rounding).
enum class Part { kRouter, kExperts, kLayer, kLayerNorm };

// one_kernel_router: the router in one kernel (MoeRouterParams::counter), as the pipeline runs it.
void run_moe(benchmark::State& state, const Shape& shape, Part part, bool one_kernel_router = false) {
  const int batch = int(state.range(0));
  Model& m = model(shape);
  double expert_bytes = 0;
  auto& st = steps(m, batch, expert_bytes);
  const double bytes = (part != Part::kExperts ? router_bytes(shape) : 0) + (part != Part::kRouter ? expert_bytes : 0);
  time_graph(
      state,
      [&](int i, cudaStream_t stream) {
        ops::MoeRouterParams r = router_params(m, st[i], batch);
        if (one_kernel_router) r.counter = st[i].router_counter;
        ops::MoeExpertsParams e = experts_params(m, st[i], batch, i % kWeightCopies);
        if (part == Part::kLayerNorm) {
          r.h = e.h = st[i].raw;
          r.norm_weight = e.norm_weight = m.norm;
          r.norm_eps = e.norm_eps = 1e-5f;
        }
        if (part != Part::kExperts) throw_if_error(ops::moe_router(r, stream));
        if (part != Part::kRouter) throw_if_error(ops::moe_experts(e, stream));
      },
      kCalls, bytes);
  state.counters["experts_used"] = expert_bytes / shape.expert_bytes();
}

// Naive chain: per used expert, one gate/up launch over its tokens (gathered beforehand, batch
// chunks of 16) and one down launch into y; no combine (a lower bound on the chain's cost).
void run_naive(benchmark::State& state, const Shape& shape) {
  const int batch = int(state.range(0));
  Model& m = model(shape);
  double expert_bytes = 0;
  auto& st = steps(m, batch, expert_bytes);
  struct Launch {
    int expert, tokens;
    float* x;
    float* mid;
    float* y;
  };
  std::vector<std::vector<Launch>> plan(kCalls);
  for (int i = 0; i < kCalls; ++i) {
    std::vector<std::vector<int>> tokens(shape.num_experts + shape.num_shared);
    for (int t = 0; t < batch; ++t) {
      for (int j = 0; j < shape.top_k; ++j) tokens[st[i].host_ids[t * shape.top_k + j]].push_back(t);
      for (int s = 0; s < shape.num_shared; ++s) tokens[shape.num_experts + s].push_back(t);
    }
    const std::size_t rows = std::size_t(ops::q4k_gemv_max_batch(shape.hidden, 2));  // (gate/up launches)
    for (int e = 0; e < int(tokens.size()); ++e)
      for (std::size_t c = 0; c < tokens[e].size(); c += rows) {
        const int n = int(std::min(rows, tokens[e].size() - c));
        Launch l{e, n, static_cast<float*>(device_alloc(std::size_t(n) * shape.hidden * 4)),
                 static_cast<float*>(device_alloc(std::size_t(n) * shape.inter * 4)),
                 static_cast<float*>(device_alloc(std::size_t(n) * shape.hidden * 4))};
        for (int r = 0; r < n; ++r)
          BENCH_CUDA(cudaMemcpy(l.x + std::size_t(r) * shape.hidden, st[i].h + std::size_t(tokens[e][c + r]) * shape.hidden,
                                shape.hidden * 4, cudaMemcpyDeviceToDevice));
        plan[i].push_back(l);
      }
  }
  time_graph(
      state,
      [&](int i, cudaStream_t stream) {
        const int copy = i % kWeightCopies;
        for (const Launch& l : plan[i]) {
          ops::GateUpQ4kGemvParams g;
          g.gate = m.gate[copy] + std::size_t(l.expert) * shape.matrix_bytes() / 144;
          g.up = m.up[copy] + std::size_t(l.expert) * shape.matrix_bytes() / 144;
          g.x = l.x;
          g.h = l.mid;
          g.n = shape.inter;
          g.k = shape.hidden;
          g.batch = l.tokens;
          throw_if_error(ops::gate_up_q4k_gemv(g, stream));
          ops::Q4kGemvParams d;
          d.weight = m.down[copy] + std::size_t(l.expert) * shape.matrix_bytes() / 144;
          d.x = l.mid;
          d.y = l.y;
          d.n = shape.hidden;
          d.k = shape.inter;
          d.batch = l.tokens;
          throw_if_error(ops::q4k_gemv(d, stream));
        }
      },
      kCalls, expert_bytes);
}

// ---- memory-pattern probe (bench-only ceiling) ---------------------------------------------------

// Reads matrices[0..count) (each `chunks` x 16 KiB, one expert's gate, up or down) with no math:
// blocks walk 16 KiB chunks, 4 independent 16-byte loads per thread in flight. The xor of what was
// read goes to *sink only if it equals a value it practically never has, so the loads stay.
__global__ void __launch_bounds__(kBlockThreads) read_matrices_kernel(const uint4* const* matrices, int count,
                                                                        int chunks, unsigned* sink) {
  device::wait_for_upstream();  // as the real kernels: the second of a pair waits for the first
  device::allow_downstream();
  constexpr int kChunk = 16384 / 16;  // uint4s per chunk
  unsigned acc = 0;
  for (int c = blockIdx.x; c < count * chunks; c += gridDim.x) {
    const uint4* p = matrices[c / chunks] + std::size_t(c % chunks) * kChunk + threadIdx.x;
    uint4 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) v[u] = __ldcs(p + u * kBlockThreads);
#pragma unroll
    for (int u = 0; u < 4; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if (acc == 0x9e3779b9u) *sink = acc;
}

// The used experts' bytes alone (gate | up | down of the routed and shared experts of each call),
// in one kernel, or in two chained kernels (gate and up, then down) as the expert GEMVs run.
void run_probe(benchmark::State& state, bool two_kernels) {
  const int batch = int(state.range(0));
  const Shape& shape = kKimi;
  Model& m = model(shape);
  double expert_bytes = 0;
  auto& st = steps(m, batch, expert_bytes);
  const std::size_t blocks_per_matrix = shape.matrix_bytes() / 144;
  const int chunks = int(shape.matrix_bytes() / 16384);
  if (shape.matrix_bytes() % 16384) return state.SkipWithError("matrix bytes not a multiple of 16 KiB");
  struct Tables {
    const uint4** gate_up;  // 2 x used
    const uint4** down;     // used
    int used;
  };
  std::vector<Tables> tables(kCalls);
  for (int i = 0; i < kCalls; ++i) {
    const std::set<int> used = used_experts(shape, st[i]);
    const int copy = i % kWeightCopies;
    std::vector<const uint4*> gu, dn;
    for (int e : used) {
      gu.push_back(reinterpret_cast<const uint4*>(m.gate[copy] + e * blocks_per_matrix));
      gu.push_back(reinterpret_cast<const uint4*>(m.up[copy] + e * blocks_per_matrix));
      dn.push_back(reinterpret_cast<const uint4*>(m.down[copy] + e * blocks_per_matrix));
    }
    std::vector<const uint4*> all(gu);  // one-kernel order: gate | up | down per table
    all.insert(all.end(), dn.begin(), dn.end());
    auto* t = static_cast<const uint4**>(device_alloc(all.size() * sizeof(void*)));
    BENCH_CUDA(cudaMemcpy(t, all.data(), all.size() * sizeof(void*), cudaMemcpyHostToDevice));
    tables[i] = {t, t + gu.size(), int(used.size())};
  }
  auto* sink = static_cast<unsigned*>(device_alloc(4));
  const int grid = 8 * detail::sm_count();
  time_graph(
      state,
      [&](int i, cudaStream_t stream) {
        const Tables& t = tables[i];
        if (!two_kernels) {
          throw_if_error(
              detail::launch(read_matrices_kernel, grid, 0, stream, true, "probe", t.gate_up, 3 * t.used, chunks, sink));
          return;
        }
        throw_if_error(
            detail::launch(read_matrices_kernel, grid, 0, stream, true, "probe", t.gate_up, 2 * t.used, chunks, sink));
        throw_if_error(detail::launch(read_matrices_kernel, grid, 0, stream, true, "probe", t.down, t.used, chunks, sink));
      },
      kCalls, expert_bytes);
  state.counters["experts_used"] = expert_bytes / shape.expert_bytes();
}

// The top-k alone (from fp32 logits), to split the router's time between its GEMV and top-k.
void BM_moe_kimi_topk(benchmark::State& state) {
  const int batch = int(state.range(0));
  Model& m = model(kKimi);
  std::vector<float*> logits(kCalls), weights(kCalls);
  std::vector<int*> ids(kCalls);  // own outputs: the steps' routing must stay the router's
  for (int i = 0; i < kCalls; ++i) {
    ids[i] = static_cast<int*>(device_alloc(std::size_t(batch) * kKimi.top_k * 4));
    weights[i] = static_cast<float*>(device_alloc(std::size_t(batch) * kKimi.top_k * 4));
    logits[i] = static_cast<float*>(device_alloc(std::size_t(batch) * kKimi.num_experts * 4));
    fill_random_floats(logits[i], std::size_t(batch) * kKimi.num_experts, 3000 + i, -3.f, 3.f);
  }
  time_graph(
      state,
      [&](int i, cudaStream_t stream) {
        ops::MoeTopkParams p;
        p.config = routing_for(kKimi);
        p.logits = logits[i];
        p.bias = m.bias;
        p.batch = batch;
        p.topk_ids = ids[i];
        p.topk_weights = weights[i];
        throw_if_error(ops::moe_topk(p, stream));
      },
      kCalls, double(batch) * kKimi.num_experts * 4);
}

void BM_moe_kimi_layer(benchmark::State& s) { run_moe(s, kKimi, Part::kLayer); }
void BM_moe_kimi_layer_fused_norm(benchmark::State& s) { run_moe(s, kKimi, Part::kLayerNorm); }
void BM_moe_kimi_router(benchmark::State& s) { run_moe(s, kKimi, Part::kRouter); }
void BM_moe_kimi_router_one_kernel(benchmark::State& s) { run_moe(s, kKimi, Part::kRouter, true); }
void BM_moe_kimi_layer_fused_norm_one_kernel_router(benchmark::State& s) { run_moe(s, kKimi, Part::kLayerNorm, true); }
void BM_moe_kimi_experts(benchmark::State& s) { run_moe(s, kKimi, Part::kExperts); }
void BM_moe_kimi_naive_chain(benchmark::State& s) { run_naive(s, kKimi); }
void BM_moe_kimi_probe_one_kernel(benchmark::State& s) { run_probe(s, false); }
void BM_moe_kimi_probe_two_kernels(benchmark::State& s) { run_probe(s, true); }
void BM_moe_ggml_shape_experts(benchmark::State& s) { run_moe(s, kGgml, Part::kExperts); }
void BM_moe_ggml_shape_naive_chain(benchmark::State& s) { run_naive(s, kGgml); }

BENCHMARK(BM_moe_kimi_layer)->Arg(1)->Arg(8)->Arg(32)->Arg(64)->UseManualTime();
BENCHMARK(BM_moe_kimi_layer_fused_norm)->Arg(1)->Arg(8)->Arg(32)->Arg(64)->UseManualTime();
BENCHMARK(BM_moe_kimi_router)->Arg(1)->Arg(8)->Arg(16)->Arg(32)->Arg(64)->UseManualTime();
BENCHMARK(BM_moe_kimi_router_one_kernel)->Arg(1)->Arg(8)->Arg(32)->Arg(64)->UseManualTime();
BENCHMARK(BM_moe_kimi_layer_fused_norm_one_kernel_router)->Arg(1)->Arg(8)->Arg(32)->Arg(64)->UseManualTime();
BENCHMARK(BM_moe_kimi_topk)->Arg(1)->Arg(16)->Arg(64)->UseManualTime();
BENCHMARK(BM_moe_kimi_experts)->Arg(1)->Arg(8)->Arg(32)->Arg(64)->UseManualTime();
BENCHMARK(BM_moe_kimi_naive_chain)->Arg(1)->Arg(8)->UseManualTime();
BENCHMARK(BM_moe_kimi_probe_one_kernel)->Arg(1)->Arg(8)->Arg(32)->Arg(64)->UseManualTime();
BENCHMARK(BM_moe_kimi_probe_two_kernels)->Arg(1)->Arg(8)->Arg(32)->Arg(64)->UseManualTime();
BENCHMARK(BM_moe_ggml_shape_experts)->Arg(1)->Arg(8)->UseManualTime();
BENCHMARK(BM_moe_ggml_shape_naive_chain)->Arg(1)->Arg(8)->UseManualTime();

}  // namespace
}  // namespace encore::bench
