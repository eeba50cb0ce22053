// MLA decode benchmarks, Kimi-Linear shape (32 heads, NoPE): split-KV attention + combine over the
// paged latent cache, graph-replayed, caches rotated beyond L2. Bytes counted: one 576-wide bf16
// row per cached token (it serves K and V), i.e. 1152 B per token; partials are not counted.
// Rows: attention (split-KV + combine), split-KV alone (the combine's share is the difference),
// and the scheduler alone (run once per step, shared by the 7 MLA layers).
//
// Measured 2026-12-02 on one H200 (132 SMs, measured read 4457-4472 GB/s), us per call (median):
// split-KV with Q^T in registers (each K element read once from shared memory), 2 cp.async
// stages of whole pages; parallel tape scheduler.
//   B x S      attention  %read  split-KV only  combine share  scheduler  FlashMLA sm90
//   1 x 4K       16.2       6.5      10.7            34%           2.3        23.6
//   1 x 32K      31.8      26.6      22.0            31%           2.6        45.0
//   1 x 128K     67.5      50.0      57.7            15%           2.6        75.7
//   64 x 4K     121.5      55.6     108.5            11%           3.1        97
//   128 x 8K    411.0      65.7     391.9             5%           3.4       319
// Account of the split-KV time at 128 x 8K: the loads alone 302.6 us (90% of read bandwidth), the
// math alone 260.2 us, both 388.5 us: with two whole-page stages only one page is in flight while
// a page is computed, so the two barely overlap. Bulk row copies (mbarrier) measured 576.7 us.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include <benchmark/benchmark.h>
#include <cuda_bf16.h>

#include <encore/ops/mla.h>

#include "bench_util.h"
#include "mla/mla_splitkv_kernel.cuh"

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

enum Mode { kAttention = 0, kSplitKvOnly = 1, kSchedOnly = 2, kBulkCopy = 3, kLoadsOnly = 4, kComputeOnly = 5 };

// The split-KV kernel with another variant of the body (mla_splitkv_tile.cuh): for the account of
// the time only (loads-only and compute-only give meaningless outputs).
template <mla::SplitKvVariant V>
void launch_variant(const MlaAttentionParams& p, cudaStream_t st) {
  const std::size_t smem = mla::mla_splitkv_smem_bytes();
  mla::mla_splitkv_kernel<V><<<mla_splitkv_num_tiles(p), kBlockThreads, smem, st>>>(p);
  BENCH_CUDA(cudaGetLastError());
}

void set_variant_smem() {
  const int smem = int(mla::mla_splitkv_smem_bytes());
  BENCH_CUDA(cudaFuncSetAttribute(mla::mla_splitkv_kernel<mla::SplitKvVariant::kBulk>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  BENCH_CUDA(cudaFuncSetAttribute(mla::mla_splitkv_kernel<mla::SplitKvVariant::kLoadsOnly>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  BENCH_CUDA(cudaFuncSetAttribute(mla::mla_splitkv_kernel<mla::SplitKvVariant::kComputeOnly>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
}

void BM_MlaDecode(benchmark::State& state) {
  const int batch = int(state.range(0)), len = int(state.range(1)), mode = int(state.range(2));
  const int parts_arg = int(state.range(3));  // 0: mla_num_parts (one part per SM)
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

  const int parts = parts_arg > 0 ? parts_arg : mla_num_parts(heads);
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

  set_variant_smem();
  time_graph(state, [&](int i, cudaStream_t st) {
    MlaAttentionParams p = ap;
    p.cache = cache;
    p.cache.pages = pool.as<__nv_bfloat16>() + (cache_bytes / 2) * (i % copies);
    if (mode == kAttention) check(mla_attention(p, st));
    else if (mode == kSplitKvOnly) check(mla_splitkv(p, st));
    else if (mode == kSchedOnly) check(mla_sched(sp, st));
    else if (mode == kBulkCopy) launch_variant<mla::SplitKvVariant::kBulk>(p, st);
    else if (mode == kLoadsOnly) launch_variant<mla::SplitKvVariant::kLoadsOnly>(p, st);
    else launch_variant<mla::SplitKvVariant::kComputeOnly>(p, st);
  }, std::max(copies, 8), mode == kSchedOnly ? 0.0 : bytes);
  state.counters["splits"] = ns[batch];
  state.counters["copies"] = copies;
  static const char* const labels[] = {"splitkv+combine", "splitkv only", "scheduler only", "splitkv bulk-copy variant",
                                       "splitkv loads only (no math)", "splitkv math only (no loads)"};
  state.SetLabel(labels[mode]);
}

void mla_shapes(benchmark::internal::Benchmark* b) {
  for (int mode : {kAttention, kSplitKvOnly, kSchedOnly})
    for (auto [batch, len] : {std::pair{1, 4096}, {1, 32768}, {1, 131072}, {64, 4096}, {128, 8192}}) b->Args({batch, len, mode, 0});
  // Fewer parts at batch 1: fewer, longer splits (less partial traffic and combine work, fewer SMs).
  for (int parts : {66, 33})
    for (int len : {4096, 32768}) b->Args({1, len, kAttention, parts});
  // Account of the split-KV time: copy variant, loads alone, math alone.
  for (int mode : {kBulkCopy, kLoadsOnly, kComputeOnly})
    for (auto [batch, len] : {std::pair{1, 4096}, {1, 131072}, {128, 8192}}) b->Args({batch, len, mode, 0});
}
BENCHMARK(BM_MlaDecode)->Apply(mla_shapes)->ArgNames({"B", "S", "mode", "parts"})->UseManualTime();

}  // namespace
}  // namespace encore
