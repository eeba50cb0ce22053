// MLA decode benchmarks, Kimi-Linear shape (32 heads, NoPE): split-KV attention + combine over the
// paged latent cache, graph-replayed, caches rotated beyond L2. Bytes counted: one 576-wide bf16
// row per cached token (it serves K and V), i.e. 1152 B per token; partials are not counted.
// Rows: attention fused into one kernel (mla_attention with counters), split-KV + combine as two
// kernels, split-KV alone (the combine's share is the difference), and the scheduler alone (run
// once per step, shared by the 7 MLA layers); at 128 x 8K also the account of the split-KV time,
// and at B = 1 split-KV without its math. BM_MlaChainProbe: the dependent chain any split design
// runs at B = 1, with no math (below).
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
// B = 1 without math (2026-12-04, H200, read 4384-4507 GB/s): split-KV loads alone 6.37 us at 1 x 4K,
// 15.22 us (56.6%) at 1 x 32K; the chain probe 7.37-7.67 us at 1 x 4K (4.10-4.34 us up to the partial
// write, 0.65 us an empty kernel), 15.5-15.8 us (54-55%) at 1 x 32K (11.8-12.2 us, 70-71%, without
// the merge; the same with 2, 4 or 6 chunks in flight per block).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
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
  kSplitKvHalfSm = 7,  // split-KV alone in the tile shape for half an SM (two blocks per SM)
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
  DeviceMemory q576(std::size_t(batch) * heads * kMlaRowDim * 2), meta(std::size_t(parts) * kMlaPartPlanInts * 4),
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
  sp.batch = batch;
  sp.num_parts = parts;
  sp.part_plans = meta.as<ops::MlaPartPlan>();
  sp.num_splits = splits.as<std::int32_t>();
  sp.error_flag = flag.as<std::int32_t>();
  check(mla_sched(sp, nullptr));
  std::vector<std::int32_t> ns(batch + 1);
  BENCH_CUDA(cudaMemcpy(ns.data(), splits.ptr, ns.size() * 4, cudaMemcpyDeviceToHost));

  MlaAttentionParams ap;
  ap.q576 = q576.as<__nv_bfloat16>();
  ap.seq_lens = d_lens.as<std::int32_t>();
  ap.part_plans = meta.as<ops::MlaPartPlan>();
  ap.num_splits = splits.as<std::int32_t>();
  ap.error_flag = flag.as<std::int32_t>();
  ap.batch = batch;
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
      case kSplitKvHalfSm: check(mla::mla_splitkv_half_sm(p, st)); break;
      default: launch_variant<V::kComputeOnly>(p, st); break;
    }
  }, std::max(copies, 8), mode == kSchedOnly ? 0.0 : bytes);
  state.counters["splits"] = ns[batch];
  state.counters["copies"] = copies;
  static const char* const labels[] = {"attention fused (op)", "splitkv + combine kernels", "splitkv only",
                                       "scheduler only", "(unused)", "splitkv loads only (no math)",
                                       "splitkv math only (no loads)", "splitkv only, half-SM tiles (16 heads, 1 slot)"};
  state.SetLabel(labels[mode]);
}

void mla_shapes(benchmark::internal::Benchmark* b) {
  const std::pair<int, int> shapes[] = {{1, 4096}, {1, 32768}, {1, 131072}, {64, 4096}, {128, 8192}};
  for (int mode : {kAttention, kUnfused, kSplitKvOnly, kSchedOnly, kSplitKvHalfSm})
    for (auto [batch, len] : shapes) b->Args({batch, len, mode, 0});
  // Account of the split-KV time: loads alone, math alone.
  for (int mode : {kLoadsOnly, kComputeOnly}) b->Args({128, 8192, mode, 0});
  for (int len : {4096, 32768}) b->Args({1, len, kLoadsOnly, 0});  // B = 1: the op's own chain without math
  // B = 1 with fewer, longer splits than one part per SM (fewer partials to merge).
  for (int len : {4096, 32768})
    for (int parts : {33, 66}) b->Args({1, len, kAttention, parts});
}
BENCHMARK(BM_MlaDecode)->Apply(mla_shapes)->ArgNames({"B", "S", "mode", "parts"})->UseManualTime();

// ---- B = 1: the split design's dependent chain with no math (a floor for the B = 1 targets) ----
// Any split-KV decode at B = 1 spreads the cache over the SMs and merges the splits across them.
// Each probe block: reads the sequence length, its chunks' page ids, copies its rows (bulk copies
// of half pages, 36 KB), writes a partial the size of a bf16 one (32 heads x 512) with its LSEs,
// meets the other blocks on an integer counter (all blocks are resident: one per SM), then merges
// its slice of the output from every block's partial and writes it. No attention math at all.
// Stages: kChain everything; kNoMerge up to the partial write; kEmpty an empty kernel of the same grid.
enum class ChainStage { kChain = 0, kNoMerge = 1, kEmpty = 2 };
constexpr int kChainHeads = 32, kChunkTokens = 32, kChunkBytes = kChunkTokens * kMlaRowDim * 2, kMaxChainStages = 6;
constexpr int kMaxBlocks = 256;       // the probe's grid (one block per SM)
constexpr int kMaxChainChunks = 32;   // chunks per block

struct ChainProbeArgs {
  const __nv_bfloat16* pages;
  const std::int32_t* block_table;
  const std::int32_t* seq_lens;
  __nv_bfloat16* partial;  // [grid][heads][512]
  float* partial_lse;      // [grid][heads]
  float* out;              // [heads][512]
  unsigned* counter;       // grows by gridDim.x per call
  ChainStage stage;
  int stages;              // chunks in flight per block (<= kMaxChainStages)
};

__global__ void __launch_bounds__(256, 1) mla_chain_probe_kernel(const __grid_constant__ ChainProbeArgs a) {
  namespace dev = encore::device;
  if (a.stage == ChainStage::kEmpty) return;
  extern __shared__ __align__(128) char chunks[];  // [stages][kChunkBytes]
  __shared__ std::uint64_t bars[kMaxChainStages];
  __shared__ std::int32_t page_ids[kMaxChainChunks];
  const int tid = threadIdx.x, G = gridDim.x, b = blockIdx.x, stages = a.stages;
  if (tid == 0) {
    for (int s = 0; s < stages; ++s) dev::barrier_init(&bars[s], 1);
    dev::fence_barrier_init();
  }
  const int len = __ldcg(a.seq_lens);
  const int total = (len + kChunkTokens - 1) / kChunkTokens;
  const int first = int(std::int64_t(total) * b / G), count = int(std::int64_t(total) * (b + 1) / G) - first;
  if (tid < count) page_ids[tid] = __ldcg(a.block_table + (first + tid) / 2);
  __syncthreads();
  auto issue = [&](int i) {  // thread 0: chunk first + i into stage i % stages
    const int c = first + i, tokens = min(kChunkTokens, len - c * kChunkTokens);
    const std::uint32_t bytes = std::uint32_t(tokens) * kMlaRowDim * 2;
    dev::barrier_arrive_expect(&bars[i % stages], bytes);
    const __nv_bfloat16* src = a.pages + (std::int64_t(page_ids[i]) * kMlaPageTokens + (c % 2) * kChunkTokens) * kMlaRowDim;
    dev::bulk_copy_to_shared(chunks + (i % stages) * kChunkBytes, src, bytes, &bars[i % stages]);
  };
  if (tid == 0)
    for (int i = 0; i < min(count, stages); ++i) issue(i);
  std::uint32_t seen = 0;  // a word of each chunk, so the copies are consumed
  for (int i = 0; i < count; ++i) {
    dev::barrier_wait(&bars[i % stages], (i / stages) & 1u);
    seen ^= reinterpret_cast<const std::uint32_t*>(chunks + (i % stages) * kChunkBytes)[tid];
    __syncthreads();
    if (tid == 0 && i + stages < count) issue(i + stages);
  }
  // The partial: 32 x 512 bf16 (4 KB per pass of the block) and the LSEs.
  constexpr int kPartialWords = kChainHeads * kMlaLatentDim / 8;  // uint4 = 8 bf16
  uint4* part = reinterpret_cast<uint4*>(a.partial + std::int64_t(b) * kChainHeads * kMlaLatentDim);
  for (int i = tid; i < kPartialWords; i += blockDim.x) part[i] = make_uint4(seen, seen + i, seen, i);
  if (tid < kChainHeads) a.partial_lse[b * kChainHeads + tid] = float(seen & 0xFF) * 1e-3f + tid;
  if (a.stage == ChainStage::kNoMerge) return;
  // Every block's partial is complete before any block merges (release / acquire on the counter).
  __syncthreads();
  if (tid == 0) {
    __threadfence();
    const unsigned old = atomicAdd(a.counter, 1u);
    const unsigned target = (old / unsigned(G) + 1u) * unsigned(G);
    unsigned now;
    do {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(now) : "l"(a.counter) : "memory");
    } while (int(now - target) < 0);
  }
  __syncthreads();
  // This block's slice of the outputs (consecutive columns, a head's at 4K): the LSE-weighted
  // sum over every partial. Thread t reads 8 columns of partials t / 16, t / 16 + 16, ... (their
  // loads in flight together); the 16 groups' sums meet in shared memory.
  constexpr int kGroups = 16, kMaxSlice = 128;
  __shared__ float lse_of[kMaxBlocks];
  __shared__ float sums[kGroups][kMaxSlice], dens[kGroups];
  const int outputs = kChainHeads * kMlaLatentDim, per_block = min((outputs + 8 * G - 1) / (8 * G) * 8, kMaxSlice);
  const int e0 = b * per_block, head = min(e0, outputs - 1) / kMlaLatentDim;
  if (tid < G) lse_of[tid] = __ldcg(a.partial_lse + tid * kChainHeads + head);
  __syncthreads();
  float max_lse = -INFINITY;
  for (int j = 0; j < G; ++j) max_lse = fmaxf(max_lse, lse_of[j]);
  const int group = tid / kGroups, col8 = tid % kGroups;  // 16 threads x 8 columns = 128 columns
  float num[8] = {}, den = 0.f;
  if (col8 * 8 < per_block && e0 + col8 * 8 < outputs) {
#pragma unroll 8
    for (int j = group; j < G; j += kGroups) {
      const float w = __expf(lse_of[j] - max_lse);
      const uint4 raw = __ldcg(reinterpret_cast<const uint4*>(a.partial + std::int64_t(j) * outputs + e0) + col8);
      const std::uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        num[2 * i] += w * __uint_as_float(words[i] << 16);
        num[2 * i + 1] += w * __uint_as_float(words[i] & 0xFFFF0000u);
      }
      den += w;
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) sums[group][col8 * 8 + i] = num[i];
    if (col8 == 0) dens[group] = den;
  }
  __syncthreads();
  if (tid < per_block && e0 + tid < outputs) {
    float n = 0.f, d = 0.f;
    for (int g = 0; g < kGroups; ++g) n += sums[g][tid], d += dens[g];
    a.out[e0 + tid] = n / d;
  }
}

void BM_MlaChainProbe(benchmark::State& state) {
  const int len = int(state.range(0));
  const auto stage = ChainStage(state.range(1));
  const int stages = int(state.range(2));
  const int pages = (len + kMlaPageTokens - 1) / kMlaPageTokens;
  const std::size_t cache_bytes = std::size_t(pages) * kMlaPageTokens * kMlaRowDim * 2;
  const int copies = rotation_count(cache_bytes);
  DeviceMemory pool(cache_bytes * copies);
  fill_bf16<<<2048, 256>>>(pool.as<__nv_bfloat16>(), cache_bytes * copies / 2, 11);
  BENCH_CUDA(cudaGetLastError());
  int sms = 0;
  BENCH_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int chunks = (len + kChunkTokens - 1) / kChunkTokens, grid = std::min({sms, chunks, kMaxBlocks});
  if ((chunks + grid - 1) / grid > kMaxChainChunks) {
    state.SkipWithError("more chunks per block than the probe holds");
    return;
  }
  std::vector<std::int32_t> table(pages);  // the pages in a shuffled order
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), std::mt19937(7));
  DeviceMemory d_table(table.size() * 4), d_len(4), partial(std::size_t(grid) * kChainHeads * kMlaLatentDim * 2),
      partial_lse(std::size_t(grid) * kChainHeads * 4), out(kChainHeads * kMlaLatentDim * 4), counter(4);
  BENCH_CUDA(cudaMemcpy(d_table.ptr, table.data(), table.size() * 4, cudaMemcpyHostToDevice));
  BENCH_CUDA(cudaMemcpy(d_len.ptr, &len, 4, cudaMemcpyHostToDevice));
  BENCH_CUDA(cudaMemset(counter.ptr, 0, 4));
  const int smem = stages * kChunkBytes;
  BENCH_CUDA(cudaFuncSetAttribute(mla_chain_probe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  ChainProbeArgs args{nullptr, d_table.as<std::int32_t>(), d_len.as<std::int32_t>(), partial.as<__nv_bfloat16>(),
                      partial_lse.as<float>(), out.as<float>(), counter.as<unsigned>(), stage, stages};
  time_graph(state, [&](int i, cudaStream_t st) {
    ChainProbeArgs a = args;
    a.pages = pool.as<__nv_bfloat16>() + (cache_bytes / 2) * (i % copies);
    mla_chain_probe_kernel<<<grid, 256, smem, st>>>(a);
    BENCH_CUDA(cudaGetLastError());
  }, std::max(copies, 8), double(len) * kMlaRowDim * 2);
  state.counters["blocks"] = grid;
  static const char* const labels[] = {"chain: len, page ids, rows, partial, grid barrier, merge (no math)",
                                       "chain up to the partial write (no merge)", "empty kernel, same grid"};
  state.SetLabel(labels[int(stage)]);
}
BENCHMARK(BM_MlaChainProbe)->ArgsProduct({{4096, 32768}, {0, 1, 2}, {4}})->ArgNames({"S", "stage", "stages"})->UseManualTime();
BENCHMARK(BM_MlaChainProbe)->ArgsProduct({{32768}, {0, 1}, {2, 6}})->ArgNames({"S", "stage", "stages"})->UseManualTime();

}  // namespace
}  // namespace encore
