// MLA decode benchmarks, Kimi-Linear shape (32 heads, NoPE): split-KV attention + combine over the
// paged latent cache, graph-replayed, caches rotated beyond L2. Bytes counted: one 576-wide bf16
// row per cached token (it serves K and V), i.e. 1152 B per token; partials are not counted.
// Rows: attention (split-KV + combine), split-KV alone (the combine's share is the difference),
// and the scheduler alone (run once per step, shared by the 7 MLA layers).
//
// Measured 2026-12-02 on one H200 (132 SMs, measured read 4421 GB/s), mma.sync design (32 rows x
// 64-token pages, 2 cp.async stages), us per call:
//   B x S        attention  GB/s  %read  split-KV only  combine share  scheduler  FlashMLA sm90
//   1 x 4K         14.3      329    7.4       9.2           36%           2.0        23.6
//   1 x 32K        30.7     1232   27.9      23.2           24%           2.4        45.0
//   1 x 128K       73.3     2060   46.6      66.2           10%           2.4        75.7
//   64 x 4K       138.8     2176   49.2     126.7            9%          26.2        97
//   128 x 8K      456.8     2644   59.8     451.2            1%          32.8       319
// The split-KV tile is bound by its per-page critical path (~3.5 us per 64-token page per SM:
// scores -> softmax -> P V in sequence, one CTA per SM), not by HBM; the next steps are warpgroup
// ping-pong (scores of page i+1 during P V of page i) or wgmma, as FlashMLA does.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include <benchmark/benchmark.h>
#include <cuda_bf16.h>

#include <encore/ops/mla.h>

#include "bench_util.h"

namespace encore {
namespace {

using namespace encore::bench;
using namespace encore::ops;

void check(const Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "encore_bench (mla): %s\n", s.to_string().c_str());
    std::exit(2);
  }
}

struct DeviceMemory {  // freed when the benchmark case ends (the large caches do not pile up)
  void* ptr = nullptr;
  explicit DeviceMemory(std::size_t bytes) { BENCH_CUDA(cudaMalloc(&ptr, std::max<std::size_t>(bytes, 16))); }
  ~DeviceMemory() { cudaFree(ptr); }
  template <class T> T* as() const { return static_cast<T*>(ptr); }
};

__global__ void fill_bf16(__nv_bfloat16* p, std::size_t n, std::uint64_t seed) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x) {
    std::uint64_t x = (i + seed) * 0x9E3779B97F4A7C15ull;
    x ^= x >> 29;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 32;
    p[i] = __float2bfloat16(float(x & 0xFFFF) / 32768.f - 1.f);
  }
}

enum Mode { kAttention = 0, kSplitKvOnly = 1, kSchedOnly = 2 };

void BM_MlaDecode(benchmark::State& state) {
  const int batch = int(state.range(0)), len = int(state.range(1)), mode = int(state.range(2));
  const int heads = 32;
  const int pages_per_seq = (len + kMlaPageTokens - 1) / kMlaPageTokens;
  const std::size_t pages = std::size_t(batch) * pages_per_seq;
  const std::size_t cache_bytes = pages * kMlaPageTokens * kMlaRowDim * 2;
  const double bytes = double(batch) * len * kMlaRowDim * 2;
  const int copies = rotation_count(cache_bytes);
  DeviceMemory pool(cache_bytes * copies);
  fill_bf16<<<2048, 256>>>(pool.as<__nv_bfloat16>(), cache_bytes * copies / 2, 11);
  BENCH_CUDA(cudaGetLastError());

  // Block table: each request's pages, interleaved across requests (not contiguous per request).
  std::vector<std::int32_t> table(pages), lens(batch, len);
  for (int b = 0; b < batch; ++b)
    for (int j = 0; j < pages_per_seq; ++j) table[std::size_t(b) * pages_per_seq + j] = j * batch + b;
  DeviceMemory d_table(table.size() * 4), d_lens(batch * 4), d_pos(batch * 4);
  std::vector<std::int32_t> pos(batch, len - 1);
  BENCH_CUDA(cudaMemcpy(d_table.ptr, table.data(), table.size() * 4, cudaMemcpyHostToDevice));
  BENCH_CUDA(cudaMemcpy(d_lens.ptr, lens.data(), batch * 4, cudaMemcpyHostToDevice));
  BENCH_CUDA(cudaMemcpy(d_pos.ptr, pos.data(), batch * 4, cudaMemcpyHostToDevice));

  const int parts = mla_num_parts(heads);
  DeviceMemory q576(std::size_t(batch) * heads * kMlaRowDim * 2), meta(std::size_t(parts) * kMlaMetaInts * 4),
      splits((batch + 1) * 4), flag(4), o_lat(std::size_t(batch) * heads * kMlaLatentDim * 4), lse(std::size_t(batch) * heads * 4),
      part_o(std::size_t(batch + parts) * heads * kMlaLatentDim * 4), part_lse(std::size_t(batch + parts) * heads * 4);
  fill_bf16<<<256, 256>>>(q576.as<__nv_bfloat16>(), std::size_t(batch) * heads * kMlaRowDim, 5);

  MlaPagedCache cache;
  cache.num_pages = int(pages);
  cache.block_table = d_table.as<std::int32_t>();
  cache.block_table_stride = pages_per_seq;
  cache.max_pages_per_seq = pages_per_seq;
  MlaSchedParams sp;
  sp.seq_lens = d_lens.as<std::int32_t>();
  sp.positions = d_pos.as<std::int32_t>();
  sp.cache = cache;
  sp.num_seqs = batch;
  sp.num_parts = parts;
  sp.sched_meta = meta.as<std::int32_t>();
  sp.num_splits = splits.as<std::int32_t>();
  sp.error_flag = flag.as<std::int32_t>();
  check(mla_sched(sp, nullptr));
  std::vector<std::int32_t> ns(batch + 1);
  BENCH_CUDA(cudaMemcpy(ns.data(), splits.ptr, ns.size() * 4, cudaMemcpyDeviceToHost));

  MlaAttentionParams ap;
  ap.q576 = q576.as<__nv_bfloat16>();
  ap.seq_lens = d_lens.as<std::int32_t>();
  ap.sched_meta = meta.as<std::int32_t>();
  ap.num_splits = splits.as<std::int32_t>();
  ap.error_flag = flag.as<std::int32_t>();
  ap.num_seqs = batch;
  ap.num_heads = heads;
  ap.num_parts = parts;
  ap.softmax_scale = kMlaScaleKimi;
  ap.o_lat = o_lat.as<float>();
  ap.lse = lse.as<float>();
  ap.partial_o = part_o.as<float>();
  ap.partial_lse = part_lse.as<float>();

  time_graph(state, [&](int i, cudaStream_t st) {
    MlaAttentionParams p = ap;
    p.cache = cache;
    p.cache.pages = pool.as<__nv_bfloat16>() + (cache_bytes / 2) * (i % copies);
    if (mode == kAttention) check(mla_attention(p, st));
    else if (mode == kSplitKvOnly) check(mla_splitkv(p, st));
    else check(mla_sched(sp, st));
  }, std::max(copies, 8), mode == kSchedOnly ? 0.0 : bytes);
  state.counters["splits"] = ns[batch];
  state.counters["copies"] = copies;
  state.SetLabel(mode == kAttention ? "splitkv+combine" : mode == kSplitKvOnly ? "splitkv only" : "scheduler only");
}

void mla_shapes(benchmark::internal::Benchmark* b) {
  for (int mode : {kAttention, kSplitKvOnly, kSchedOnly})
    for (auto [batch, len] : {std::pair{1, 4096}, {1, 32768}, {1, 131072}, {64, 4096}, {128, 8192}}) b->Args({batch, len, mode});
}
BENCHMARK(BM_MlaDecode)->Apply(mla_shapes)->ArgNames({"B", "S", "mode"})->UseManualTime();

}  // namespace
}  // namespace encore
