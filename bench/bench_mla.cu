// MLA decode benchmarks, Kimi-Linear shape (32 heads, NoPE): split-KV attention + combine over the
// paged latent cache, graph-replayed, caches rotated beyond L2. Bytes counted: one 576-wide bf16
// row per cached token (it serves K and V), i.e. 1152 B per token; partials are not counted.
// Rows: attention fused into one kernel (mla_attention with counters), split-KV + combine as two
// kernels, split-KV alone (the combine's share is the difference), and the scheduler alone (run
// once per step, shared by the 7 MLA layers); at 128 x 8K also the account of the split-KV time.
//
// Measured 2026-12-03 on one H200 (132 SMs, measured read 4394 GB/s; bench/RESULTS.md, fourteenth
// session, run 15; pages by TMA), us per call (median; scheduler from run 9 of the thirteenth):
//   B x S      fused  %read  2 kernels  split-KV only  scheduler  FlashMLA sm90
//   1 x 4K     14.11   7.6     13.70         8.81         2.32        23.6
//   1 x 32K    24.14  35.6     24.79        18.06         2.64        45.0
//   1 x 128K   53.25  64.5     54.03        47.09         2.62        75.7
//   64 x 4K    98.46  69.8    101.26        86.27         3.14        97
//   128 x 8K  305.23  90.1    323.67       300.37         3.37       319
// The fused 128 x 8K ran 299.6-307.8 us (89.2-90.1% of read) on the four H200s of that session.
// Account of the split-KV time at 128 x 8K: loads alone 288.6 us (95.2% of read), math alone 229.8 us.
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

enum Mode {
  kAttention = 0,    // mla_attention with counters: the fused one-kernel path
  kUnfused = 1,      // mla_splitkv then mla_combine
  kSplitKvOnly = 2,  // mla_splitkv alone (the combine's share is the difference)
  kSchedOnly = 3,
  kLoadsOnly = 5,     // (4 was a bulk-copy variant of the mma.sync body, gone with it)
  kComputeOnly = 6,
};

// The split-KV kernel with another variant of the body (mla_splitkv_tile.cuh): for the account of
// the time only (loads-only and compute-only give meaningless outputs).
template <mla::SplitKvVariant V>
void launch_variant(const MlaAttentionParams& p, cudaStream_t st) {
  const int smem = int(mla::mla_splitkv_smem_bytes());
  static const bool attr_set = [&] {  // once per kernel
    BENCH_CUDA(cudaFuncSetAttribute(mla::mla_splitkv_kernel<V>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    return true;
  }();
  (void)attr_set;
  mla::SplitKvArgs args;
  check(mla::splitkv_args(p, &args));
  mla::mla_splitkv_kernel<V><<<mla_splitkv_num_tiles(p), kBlockThreads, smem, st>>>(args);
  BENCH_CUDA(cudaGetLastError());
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
      part_o(std::size_t(batch + parts) * heads * kMlaLatentDim * 4), part_lse(std::size_t(batch + parts) * heads * 4),
      counters(std::size_t(batch) * 4);
  BENCH_CUDA(cudaMemset(counters.ptr, 0, std::size_t(batch) * 4));  // the fused kernel leaves them zero
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
  ap.counters = counters.as<std::int32_t>();
  if (mode == kAttention && !mla_attention_fused(ap)) {
    state.SkipWithError("the fused path does not apply to this shape");
    return;
  }

  time_graph(state, [&](int i, cudaStream_t st) {
    MlaAttentionParams p = ap;
    p.cache = cache;
    p.cache.pages = pool.as<__nv_bfloat16>() + (cache_bytes / 2) * (i % copies);
    using V = mla::SplitKvVariant;
    switch (mode) {
      case kAttention: check(mla_attention(p, st)); break;
      case kUnfused: check(mla_splitkv(p, st)); check(mla_combine(p, st)); break;
      case kSplitKvOnly: check(mla_splitkv(p, st)); break;
      case kSchedOnly: check(mla_sched(sp, st)); break;
      case kLoadsOnly: launch_variant<V::kLoadsOnly>(p, st); break;
      default: launch_variant<V::kComputeOnly>(p, st); break;
    }
  }, std::max(copies, 8), mode == kSchedOnly ? 0.0 : bytes);
  state.counters["splits"] = ns[batch];
  state.counters["copies"] = copies;
  static const char* const labels[] = {"attention fused (op)", "splitkv + combine kernels", "splitkv only",
                                       "scheduler only", "(unused)", "splitkv loads only (no math)",
                                       "splitkv math only (no loads)"};
  state.SetLabel(labels[mode]);
}

void mla_shapes(benchmark::internal::Benchmark* b) {
  const std::pair<int, int> shapes[] = {{1, 4096}, {1, 32768}, {1, 131072}, {64, 4096}, {128, 8192}};
  for (int mode : {kAttention, kUnfused, kSplitKvOnly, kSchedOnly})
    for (auto [batch, len] : shapes) b->Args({batch, len, mode, 0});
  // Account of the split-KV time: loads alone, math alone.
  for (int mode : {kLoadsOnly, kComputeOnly}) b->Args({128, 8192, mode, 0});
  // B = 1 with fewer, longer splits than one part per SM (fewer partials to merge).
  for (int len : {4096, 32768})
    for (int parts : {33, 66}) b->Args({1, len, kAttention, parts});
}
BENCHMARK(BM_MlaDecode)->Apply(mla_shapes)->ArgNames({"B", "S", "mode", "parts"})->UseManualTime();

}  // namespace
}  // namespace encore
