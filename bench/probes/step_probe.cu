// Bytes-alone probe of one Kimi-Linear decode step at 4K context, batch 1 or BATCH (env): the
// step's stage list (docs/model.md §4-5 byte budget; pipeline::step_bytes' expected distinct experts
// and per-sequence states and caches), each stage reading its own distinct bytes, with no math.
// Variants:
//   stream   one cooperative kernel reads all stages back to back, no barriers (the floor)
//   barrier  one cooperative kernel, a grid barrier after every stage (a megakernel with
//            whole-grid dependencies and no prefetch)
//   prefetch the same, but before each barrier every block prefetches into L2 its share of the next
//            stage's first PREFETCH_MB (a megakernel that streams weights while it waits)
//   early    the same, but before each barrier every block already reads the first EARLY_KB of its
//            share of the next stage (weights never depend on activations: what a megakernel can
//            load into shared memory before its dependency is met); the rest after the barrier
//   async    the megakernel pattern: before each barrier, one thread issues bulk async copies
//            (cp.async.bulk, mbarrier) of the first ASYNC_KB of the block's share of the next stage
//            into shared memory; after the barrier the block waits for them, consumes them, and
//            reads the rest from global memory, so the barrier's wait overlaps those loads
//   counter  a split grid barrier on one monotonic counter: arrive (block barrier, one release
//            add), then wait (one thread spins on an acquire load); no copies
//   counter+async  arrive first, THEN issue the bulk copies of the next stage's first ASYNC_KB, then
//            wait: the copies are not held back by the arrive's release ordering
//   ctr+2ahead  the split barrier with two stages of copies in flight (two shared buffers of
//            ASYNC_KB / 2 each): stage s+2's copies are issued as soon as stage s is consumed
//   flags / flags+2ahd  the split barrier without a contended atomic: each block publishes its
//            progress in its own flag (st.release), and waiters poll all flags in parallel
//            (ld.acquire, one flag per thread); `ll flags` the same with relaxed stores and loads and
//            no fence (a flag that travels in the data word itself, as NCCL's LL protocol does)
//   graph    one kernel per stage, captured into a CUDA graph (the graph path with perfect bodies)
//   graphpdl+ring  PDL as a real kernel can use it: before griddepcontrol.wait each block only
//            stages the first RING_KB of its share into shared memory (bulk copies), the rest is
//            read after the wait (the weights a GEMV can hold before its activations exist)
//   graphpdl the same with programmatic dependent launch: each kernel's loads start before the
//            previous one finishes (an upper bound on what PDL can hide: no real data dependency)
// Build: nvcc -O3 -std=c++17 -arch=sm_90a -o step_probe step_probe.cu
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace cg = cooperative_groups;

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { \
  std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); std::exit(1); } } while (0)

struct StageTable {
  int n;
  const long long* offset;  // byte offset of each stage's region (16-byte aligned)
  const long long* bytes;
};

constexpr int kThreads = 512;
constexpr int kUnroll = 8;

__device__ unsigned long long g_sink;
__device__ unsigned long long g_bar;  // the split barrier's counter, zeroed before each launch
__device__ unsigned long long g_flags[1024 * 16];  // one flag per block, 128 B apart, zeroed before each launch

// Reads 16-byte words [skip, skip + take) of this part's share of n16 words (take < 0: to the end).
__device__ __forceinline__ void read_share(const uint4* base, long long n16, int part, int parts, uint4& acc,
                                           long long skip = 0, long long take = -1) {
  long long per = (n16 + parts - 1) / parts;
  long long lo = per * part, hi = lo + per < n16 ? lo + per : n16;
  lo += skip;
  if (take >= 0 && lo + take < hi) hi = lo + take;
  for (long long i = lo + threadIdx.x; i < hi; i += (long long)kThreads * kUnroll) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      long long j = i + (long long)u * kThreads;
      v[u] = j < hi ? __ldcs(base + j) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) { acc.x ^= v[u].x; acc.y += v[u].y; acc.z ^= v[u].z; acc.w += v[u].w; }
  }
}

__device__ __forceinline__ void prefetch_share(const char* base, long long bytes, int part, int parts) {
  long long per = (bytes + parts - 1) / parts;
  long long lo = per * part, hi = lo + per < bytes ? lo + per : bytes;
  for (long long i = lo + threadIdx.x * 128LL; i < hi; i += kThreads * 128LL)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(base + i));
}

__device__ __forceinline__ unsigned smem_addr(const void* p) { return unsigned(__cvta_generic_to_shared(p)); }

// mode 0 stream, 1 barrier, 2 prefetch, 3 early, 4 async, 5 counter, 6 counter+async
// (prefetch_bytes: bytes per block loaded ahead)
__global__ void __launch_bounds__(kThreads, 1) step_coop(const char* pool, StageTable t, int mode, long long prefetch_bytes) {
  extern __shared__ __align__(128) uint4 stage_smem[];
  __shared__ __align__(8) unsigned long long mbars[2];
  cg::grid_group grid = cg::this_grid();
  uint4 acc = make_uint4(0, 0, 0, 0);
  const bool async = mode == 4 || mode == 6 || mode == 7 || mode == 9;
  const int nbuf = (mode == 7 || mode == 9) ? 2 : 1;
  const long long early16 = mode >= 3 ? prefetch_bytes / 16 / nbuf : 0;
  if (async) {
    if (threadIdx.x == 0) {
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(&mbars[0])));
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(&mbars[1])));
      asm volatile("fence.mbarrier_init.release.cluster;");
    }
    __syncthreads();
  }
  // This block's early words of stage s: [lo, lo + count).
  auto early_words = [&](int s, long long& lo) {
    long long n16 = t.bytes[s] / 16, per = (n16 + gridDim.x - 1) / gridDim.x;
    lo = per * blockIdx.x;
    long long got = n16 - lo < per ? n16 - lo : per;
    return got < 0 ? 0 : got < early16 ? got : early16;
  };
  auto issue_next = [&](int s) {  // bulk copies of stage s's early words into shared memory
    __syncthreads();                // every thread is done with the previous shared copy
    const int b = s % nbuf;
    unsigned long long& mbar = mbars[b];
    uint4* buf = stage_smem + b * early16;
    if (threadIdx.x == 0) {
      long long lo, got = early_words(s, lo);
      unsigned tx = unsigned(got * 16);
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(&mbar)), "r"(tx) : "memory");
      const char* src = pool + t.offset[s] + lo * 16;
      for (unsigned o = 0; o < tx; o += 32768) {
        unsigned sz = tx - o < 32768 ? tx - o : 32768;
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                     ::"r"(smem_addr(buf) + o), "l"(src + o), "r"(sz), "r"(smem_addr(&mbar)) : "memory");
      }
    }
  };
  unsigned parity[2] = {0, 0};
  if ((mode == 7 || mode == 9) && t.n > 1) issue_next(1);
  for (int s = 0; s < t.n; ++s) {
    const uint4* base = reinterpret_cast<const uint4*>(pool + t.offset[s]);
    if (async && s > 0) {  // the early words arrived in shared memory while we waited
      const int b = s % nbuf;
      unsigned done = 0;
      while (!done)
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                     : "=r"(done) : "r"(smem_addr(&mbars[b])), "r"(parity[b]) : "memory");
      parity[b] ^= 1;
      long long lo, got = early_words(s, lo);
      const uint4* buf = stage_smem + b * early16;
      for (long long i = threadIdx.x; i < got; i += kThreads) { uint4 v = buf[i]; acc.x ^= v.x; acc.y += v.y; }
    }
    read_share(base, t.bytes[s] / 16, blockIdx.x, gridDim.x, acc, s == 0 ? 0 : early16);
    if (s + 1 == t.n) break;
    if (mode == 2)
      prefetch_share(pool + t.offset[s + 1], t.bytes[s + 1] < prefetch_bytes ? t.bytes[s + 1] : prefetch_bytes,
                     blockIdx.x, gridDim.x);
    if (mode == 3)
      read_share(reinterpret_cast<const uint4*>(pool + t.offset[s + 1]), t.bytes[s + 1] / 16, blockIdx.x, gridDim.x,
                 acc, 0, early16);
    if (mode == 4) issue_next(s + 1);
    if (mode >= 1 && mode <= 4) grid.sync();
    if (mode == 8 || mode == 9 || mode == 10) {  // per-block flags: publish, (issue copies), poll every flag
      __syncthreads();
      if (threadIdx.x == 0) {
        if (mode == 10)  // LL style: the flag travels in the data word itself, no fence
          asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(&g_flags[blockIdx.x * 16]), "l"((unsigned long long)(s + 1)) : "memory");
        else
          asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(&g_flags[blockIdx.x * 16]), "l"((unsigned long long)(s + 1)) : "memory");
      }
      if (mode == 9 && s + 2 < t.n) issue_next(s + 2);
      for (int b = threadIdx.x; b < gridDim.x; b += kThreads) {
        unsigned long long v = 0;
        if (mode == 10)
          do { asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(&g_flags[b * 16]) : "memory"); } while (v < (unsigned long long)(s + 1));
        else
          do { asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(&g_flags[b * 16]) : "memory"); } while (v < (unsigned long long)(s + 1));
      }
      __syncthreads();
      continue;
    }
    if (mode >= 5) {  // split barrier: arrive, (issue the next copies), wait
      __syncthreads();
      if (threadIdx.x == 0) asm volatile("red.release.gpu.global.add.u64 [%0], 1;" ::"l"(&g_bar) : "memory");
      if (mode == 6) issue_next(s + 1);
      if (mode == 7 && s + 2 < t.n) issue_next(s + 2);
      if (threadIdx.x == 0) {
        unsigned long long target = (unsigned long long)(s + 1) * gridDim.x, v = 0;
        do { asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(&g_bar) : "memory"); } while (v < target);
      }
      __syncthreads();
    }
  }
  if ((acc.x ^ acc.y ^ acc.z ^ acc.w) == 0x12345678u) g_sink = acc.x;
}

// The megakernel's scheme (mode "program" above). tiles[s]: the stage's tile count; offset[s]: the
// lane rotation; counters: one per stage, zeroed before the launch; prologue: bytes per tile copied
// into shared memory before the wait. THREADS per block: 512 (the probe's other modes) or 256 (the
// real megakernel's blocks), launched one or two per SM.
template <int THREADS>
__global__ void __launch_bounds__(THREADS, 1) step_program(const char* pool, StageTable t, const int* tiles, const int* offsets,
                                                           unsigned long long* counters, long long prologue) {
  extern __shared__ __align__(128) uint4 stage_smem[];
  __shared__ __align__(8) unsigned long long mbar;
  uint4 acc = make_uint4(0, 0, 0, 0);
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(&mbar)));
    asm volatile("fence.mbarrier_init.release.cluster;");
  }
  __syncthreads();
  unsigned parity = 0;
  for (int s = 0; s < t.n; ++s) {
    const int lane = int((blockIdx.x + offsets[s]) % gridDim.x);
    if (lane >= tiles[s]) continue;  // no tile of this stage: on to the next one
    const long long n16 = t.bytes[s] / 16, per = (n16 + tiles[s] - 1) / tiles[s];
    const long long lo = per * lane, hi = lo + per < n16 ? lo + per : n16;
    const long long staged = hi > lo ? (hi - lo < prologue / 16 ? hi - lo : prologue / 16) : 0;
    const uint4* base = reinterpret_cast<const uint4*>(pool + t.offset[s]);
    if (threadIdx.x == 0) {  // the prologue: this tile's first bytes, in flight across the wait
      const unsigned tx = unsigned(staged * 16);
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(&mbar)), "r"(tx) : "memory");
      for (unsigned o = 0; o < tx; o += 32768) {
        const unsigned sz = tx - o < 32768 ? tx - o : 32768;
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                     ::"r"(smem_addr(stage_smem) + o), "l"(reinterpret_cast<const char*>(base + lo) + o), "r"(sz), "r"(smem_addr(&mbar)) : "memory");
      }
      if (s > 0) {  // the previous stage's tiles, all of them
        unsigned long long v = 0;
        // (acquire polls, as the megakernel's waits: a fence after a relaxed poll would first wait
        // for this thread's loads in flight)
        do { asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(counters + (s - 1) * 16) : "memory"); } while (v < (unsigned long long)tiles[s - 1]);
      }
    }
    __syncthreads();
    unsigned done = 0;
    while (!done)
      asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                   : "=r"(done) : "r"(smem_addr(&mbar)), "r"(parity) : "memory");
    parity ^= 1;
    for (long long i = threadIdx.x; i < staged; i += THREADS) { uint4 v = stage_smem[i]; acc.x ^= v.x; acc.y += v.y; }
    for (long long i = lo + staged + threadIdx.x; i < hi; i += THREADS) { uint4 v = __ldcs(base + i); acc.x ^= v.x; acc.y += v.y; }
    __syncthreads();
    if (threadIdx.x == 0) asm volatile("red.release.gpu.global.add.u64 [%0], 1;" ::"l"(counters + s * 16) : "memory");
  }
  if ((acc.x ^ acc.y ^ acc.z ^ acc.w) == 0x12345678u) g_sink = acc.x;
}

__global__ void __launch_bounds__(kThreads, 1) stage_kernel(const char* pool, long long offset, long long bytes, int pdl) {
  uint4 acc = make_uint4(0, 0, 0, 0);
  if (pdl) asm volatile("griddepcontrol.launch_dependents;");
  read_share(reinterpret_cast<const uint4*>(pool + offset), bytes / 16, blockIdx.x, gridDim.x, acc);
  if (pdl) asm volatile("griddepcontrol.wait;" ::: "memory");
  if ((acc.x ^ acc.y ^ acc.z ^ acc.w) == 0x12345678u) g_sink = acc.x;
}

__global__ void __launch_bounds__(kThreads, 1) stage_kernel_ring(const char* pool, long long offset, long long bytes,
                                                                  long long ring_bytes) {
  extern __shared__ __align__(128) uint4 ring[];
  __shared__ __align__(8) unsigned long long mbar;
  uint4 acc = make_uint4(0, 0, 0, 0);
  long long n16 = bytes / 16, per = (n16 + gridDim.x - 1) / gridDim.x, lo = per * blockIdx.x;
  long long got = n16 - lo < per ? n16 - lo : per;
  got = got < 0 ? 0 : got < ring_bytes / 16 ? got : ring_bytes / 16;
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(&mbar)));
    asm volatile("fence.mbarrier_init.release.cluster;");
    unsigned tx = unsigned(got * 16);
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(&mbar)), "r"(tx) : "memory");
    const char* src = pool + offset + lo * 16;
    for (unsigned o = 0; o < tx; o += 32768) {
      unsigned sz = tx - o < 32768 ? tx - o : 32768;
      asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                   ::"r"(smem_addr(ring) + o), "l"(src + o), "r"(sz), "r"(smem_addr(&mbar)) : "memory");
    }
  }
  asm volatile("griddepcontrol.launch_dependents;");
  asm volatile("griddepcontrol.wait;" ::: "memory");
  __syncthreads();
  unsigned done = 0;
  while (!done)
    asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0; selp.u32 %0, 1, 0, p; }"
                 : "=r"(done) : "r"(smem_addr(&mbar)) : "memory");
  for (long long i = threadIdx.x; i < got; i += kThreads) { uint4 v = ring[i]; acc.x ^= v.x; acc.y += v.y; }
  read_share(reinterpret_cast<const uint4*>(pool + offset), n16, blockIdx.x, gridDim.x, acc, got, -1);
  if ((acc.x ^ acc.y ^ acc.z ^ acc.w) == 0x12345678u) g_sink = acc.x;
}

int main() {
  // Stage list at 4K context (bytes per stage; state r+w counted as reads). Per sequence: the KDA
  // states and convolution windows, the MLA cache and partials; the experts: those the batch's
  // tokens touch in expectation (8 of 256 each, independently) plus the shared one.
  const int batch = std::getenv("BATCH") ? std::max(1, std::atoi(std::getenv("BATCH"))) : 1;
  const double touched = 256.0 * (1.0 - std::pow(1.0 - 8.0 / 256.0, batch));
  std::vector<long long> bytes;
  auto add = [&](long long b) { bytes.push_back((std::max(b, 16LL) + 255) / 256 * 256); };
  const bool mla[27] = {0,0,0,1,0,0,0,1,0,0,0,1,0,0,0,1,0,0,0,1,0,0,0,1,0,0,1};
  add(4608LL * batch);                            // embed
  for (int l = 0; l < 27; ++l) {
    if (!mla[l]) {
      add(15925248 + 331776 + 41472 + 9216);       // kda in_proj (q,k,v,f_a,g_a,b) + norm
      add(2097152 + batch * (2 * 2097152LL + 2 * 147456)); // kda op: f_b,g_b + state r+w + conv r+w
      add(5308416);                                // o_proj
    } else {
      if (l == 3) add(4096);                       // mla scheduler
      add(7962624 + 746496 + 9216);                // mla in_proj (q, kv_a)
      add(4194304);                                // q_absorb (W_UK)
      add(4096);                                   // kv_append
      add(4096LL * 1152 * batch);                  // split-KV: 4K latent cache
      add(65536LL * batch);                        // combine (partials)
      add(4194304);                                // v_up (W_UV)
      add(5308416);                                // o_proj
    }
    if (l == 0) {
      add(23887872);                               // dense gate/up
      add(11943936);                               // dense down
    } else {
      add(1179648 + 1024 + 9216);                  // router (bf16) + bias + norm
      add((long long)((touched + 1.0) * 3981312)); // experts: routed + shared (gate/up + down)
    }
  }
  add(212336640 + 9216);                           // lm_head
  int n = int(bytes.size());
  std::vector<long long> off(n);
  long long total = 0;
  for (int i = 0; i < n; ++i) { off[i] = total; total += bytes[i]; }

  int dev = 0; cudaDeviceProp prop; CK(cudaGetDeviceProperties(&prop, dev));
  int per_sm = 0; CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, step_coop, kThreads, 0));
  if (const char* b = std::getenv("BLOCKS_PER_SM")) per_sm = std::min(per_sm, std::atoi(b));
  int grid = prop.multiProcessorCount * per_sm;
  // Several copies of the step's bytes, rotated per run, so nothing stays in L2 between runs.
  const int copies = 3;
  char* pool; CK(cudaMalloc(&pool, total * copies));
  CK(cudaMemset(pool, 1, total * copies));
  long long *d_off, *d_bytes;
  CK(cudaMalloc(&d_off, n * sizeof(long long) * copies)); CK(cudaMalloc(&d_bytes, n * sizeof(long long)));
  std::vector<long long> offs(n * copies);
  for (int c = 0; c < copies; ++c) for (int i = 0; i < n; ++i) offs[c * n + i] = off[i] + c * total;
  CK(cudaMemcpy(d_off, offs.data(), offs.size() * 8, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_bytes, bytes.data(), n * 8, cudaMemcpyHostToDevice));
  std::printf("device %s, %d SMs, grid %d x %d threads; batch %d: %d stages, %.1f MB per step\n", prop.name,
              prop.multiProcessorCount, grid, kThreads, batch, n, total / 1e6);

  cudaStream_t st; CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
  auto time_med = [&](auto&& launch, int reps) {
    std::vector<float> ms;
    for (int r = 0; r < reps + 3; ++r) {
      CK(cudaEventRecord(e0, st)); launch(r % copies); CK(cudaEventRecord(e1, st));
      CK(cudaEventSynchronize(e1)); float t; CK(cudaEventElapsedTime(&t, e0, e1));
      if (r >= 3) ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end()); return ms[ms.size() / 2] * 1000.0f;
  };
  CK(cudaFuncSetAttribute(step_coop, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 << 10));
  void* bar_ptr; CK(cudaGetSymbolAddress(&bar_ptr, g_bar));
  void* flags_ptr; CK(cudaGetSymbolAddress(&flags_ptr, g_flags));
  auto coop = [&](int mode, long long pf) {
    size_t smem = (mode == 4 || mode == 6 || mode == 7 || mode == 9) ? size_t(pf) : 0;
    int g = grid;
    if (smem) {
      int b = 0; CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, step_coop, kThreads, smem));
      g = prop.multiProcessorCount * std::min(b, per_sm);
    }
    return [=, &st](int c) {
      if (mode >= 5) CK(cudaMemsetAsync(bar_ptr, 0, 8, st));
      if (mode >= 8) CK(cudaMemsetAsync(flags_ptr, 0, sizeof(unsigned long long) * 1024 * 16, st));
      StageTable t{n, d_off + c * n, d_bytes};
      void* args[] = {(void*)&pool, (void*)&t, (void*)&mode, (void*)&pf};
      CK(cudaLaunchCooperativeKernel((void*)step_coop, g, kThreads, args, smem, st));
    };
  };
  // The same barriers with no bytes: the dependency latency alone.
  {
    std::vector<long long> zero(n, 0);
    long long* d_zero; CK(cudaMalloc(&d_zero, n * 8)); CK(cudaMemcpy(d_zero, zero.data(), n * 8, cudaMemcpyHostToDevice));
    for (int mode : {1, 5, 8, 10}) {
      float t0 = time_med([&](int c) {
        if (mode >= 5) CK(cudaMemsetAsync(bar_ptr, 0, 8, st));
        if (mode >= 8) CK(cudaMemsetAsync(flags_ptr, 0, sizeof(unsigned long long) * 1024 * 16, st));
        StageTable t{n, d_off + c * n, d_zero}; long long pf = 0;
        void* args[] = {(void*)&pool, (void*)&t, (void*)&mode, (void*)&pf};
        CK(cudaLaunchCooperativeKernel((void*)step_coop, grid, kThreads, args, 0, st));
      }, 15);
      std::printf("%s no bytes: %7.1f us for %d dependencies (%.2f us each)\n",
                  mode == 1 ? "grid.sync" : mode == 5 ? "counter  " : mode == 8 ? "flags    " : "ll flags ", t0, n - 1, t0 / (n - 1));
    }
    // PDL chain with no bytes: the hardware dependency latency
    cudaGraphExec_t ex; cudaGraph_t gr; CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < n; ++i) {
      cudaLaunchConfig_t cfg = {}; cfg.gridDim = grid; cfg.blockDim = kThreads; cfg.stream = st;
      cudaLaunchAttribute at[1]; at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      at[0].val.programmaticStreamSerializationAllowed = 1; cfg.attrs = at; cfg.numAttrs = 1;
      CK(cudaLaunchKernelEx(&cfg, stage_kernel, (const char*)pool, 0LL, 0LL, 1));
    }
    CK(cudaStreamEndCapture(st, &gr)); CK(cudaGraphInstantiate(&ex, gr, 0));
    float tp = time_med([&](int) { CK(cudaGraphLaunch(ex, st)); }, 15);
    std::printf("pdl graph no bytes: %6.1f us for %d kernels (%.2f us each)\n", tp, n, tp / n);
  }
  float stream = time_med(coop(0, 0), 15);
  float barrier = time_med(coop(1, 0), 15);
  std::printf("stream   %8.1f us  (%.0f GB/s)\n", stream, total / stream / 1e3);
  std::printf("barrier  %8.1f us  (%.2fx stream; %.2f us per barrier)\n", barrier, barrier / stream, (barrier - stream) / n);
  for (long long mb : {2LL, 8LL, 24LL}) {
    float pf = time_med(coop(2, mb << 20), 15);
    std::printf("prefetch %8.1f us  (%.2fx stream; next stage's first %lld MB into L2)\n", pf, pf / stream, mb);
  }
  for (long long kb : {16LL, 64LL, 160LL}) {
    float ea = time_med(coop(3, kb << 10), 15);
    std::printf("early    %8.1f us  (%.2fx stream; each block reads its first %lld KB of the next stage before the barrier)\n",
                ea, ea / stream, kb);
  }
  for (long long kb : {32LL, 96LL, 192LL}) {
    float as = time_med(coop(4, kb << 10), 15);
    std::printf("async    %8.1f us  (%.2fx stream; bulk copies of each block's first %lld KB of the next stage in flight across the barrier)\n",
                as, as / stream, kb);
  }
  float ctr = time_med(coop(5, 0), 15);
  std::printf("counter  %8.1f us  (%.2fx stream; split barrier on one counter)\n", ctr, ctr / stream);
  for (long long kb : {32LL, 96LL, 192LL}) {
    float ca = time_med(coop(6, kb << 10), 15);
    std::printf("ctr+async%8.1f us  (%.2fx stream; arrive, then bulk copies of the next stage's first %lld KB, then wait)\n",
                ca, ca / stream, kb);
  }
  for (long long kb : {64LL, 192LL}) {
    float c2 = time_med(coop(7, kb << 10), 15);
    std::printf("ctr+2ahd %8.1f us  (%.2fx stream; two stages of copies in flight, %lld KB each)\n", c2, c2 / stream, kb / 2);
  }
  {  // the megakernel's scheme: per-stage tiles and counters, skipping, a prologue across the wait
    std::vector<int> tiles(n), offsets(n);
    int start = 0;
    for (int i = 0; i < n; ++i) {
      tiles[i] = int(std::min<long long>(grid, (bytes[i] + (80 << 10) - 1) / (80 << 10)));
      offsets[i] = (grid - start) % grid;
      start = (start + tiles[i]) % grid;
    }
    int *d_tiles, *d_offsets;
    unsigned long long* d_counters;
    CK(cudaMalloc(&d_tiles, n * sizeof(int))); CK(cudaMalloc(&d_offsets, n * sizeof(int)));
    CK(cudaMalloc(&d_counters, n * 16 * sizeof(unsigned long long)));
    CK(cudaMemcpy(d_tiles, tiles.data(), n * sizeof(int), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_offsets, offsets.data(), n * sizeof(int), cudaMemcpyHostToDevice));
    // (threads, blocks per SM): the probe's 512-thread block; the real megakernel's one 256-thread
    // block per SM; and two such blocks per SM, each with at most half the shared memory.
    auto run_program = [&](auto kernel, int threads, int per_sm_wanted, long long kb) {
      CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 << 10));
      const size_t smem = size_t(std::max(kb, 1LL)) << 10;
      int b = 0; CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, kernel, threads, smem));
      if (b < per_sm_wanted) return;  // does not fit: no line
      const int g = prop.multiProcessorCount * per_sm_wanted;
      std::vector<int> off(n);
      int at = 0;
      for (int i = 0; i < n; ++i) {
        tiles[i] = int(std::min<long long>(g, (bytes[i] + (80 << 10) - 1) / (80 << 10)));
        off[i] = (g - at) % g, at = (at + tiles[i]) % g;
      }
      CK(cudaMemcpy(d_tiles, tiles.data(), n * sizeof(int), cudaMemcpyHostToDevice));
      CK(cudaMemcpy(d_offsets, off.data(), n * sizeof(int), cudaMemcpyHostToDevice));
      long long pro = kb << 10;
      float tp = time_med([&](int c) {
        CK(cudaMemsetAsync(d_counters, 0, n * 16 * sizeof(unsigned long long), st));
        StageTable tt{n, d_off + c * n, d_bytes};
        void* args[] = {(void*)&pool, (void*)&tt, (void*)&d_tiles, (void*)&d_offsets, (void*)&d_counters, (void*)&pro};
        CK(cudaLaunchCooperativeKernel((void*)kernel, g, threads, args, smem, st));
      }, 15);
      std::printf("program  %8.1f us  (%.2fx stream; per-stage tiles and counters, %d blocks of %d threads (%d per SM), %lld KB per tile staged before the wait)\n",
                  tp, tp / stream, g, threads, per_sm_wanted, kb);
    };
    for (long long kb : {0LL, 32LL, 80LL}) run_program(step_program<512>, 512, 1, kb);
    for (long long kb : {0LL, 32LL, 80LL}) run_program(step_program<256>, 256, 1, kb);
    for (long long kb : {0LL, 32LL, 80LL}) run_program(step_program<256>, 256, 2, kb);
  }
  float ll = time_med(coop(10, 0), 15);
  std::printf("ll flags %8.1f us  (%.2fx stream; per-block flags, relaxed, no fences)\n", ll, ll / stream);
  float fl = time_med(coop(8, 0), 15);
  std::printf("flags    %8.1f us  (%.2fx stream; per-block flags, no contended atomic)\n", fl, fl / stream);
  for (long long kb : {64LL, 192LL}) {
    float f2 = time_med(coop(9, kb << 10), 15);
    std::printf("flags+2a %8.1f us  (%.2fx stream; per-block flags, two stages of copies in flight, %lld KB each)\n", f2, f2 / stream, kb / 2);
  }
  for (int pdl = 0; pdl < 2; ++pdl) {
    cudaGraphExec_t exec[copies];
    for (int c = 0; c < copies; ++c) {
      cudaGraph_t g; CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
      for (int i = 0; i < n; ++i) {
        cudaLaunchConfig_t cfg = {}; cfg.gridDim = grid; cfg.blockDim = kThreads; cfg.stream = st;
        cudaLaunchAttribute at[1]; at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = at; cfg.numAttrs = pdl;
        CK(cudaLaunchKernelEx(&cfg, stage_kernel, (const char*)pool, offs[c * n + i], bytes[i], pdl));
      }
      CK(cudaStreamEndCapture(st, &g)); CK(cudaGraphInstantiate(&exec[c], g, 0)); CK(cudaGraphDestroy(g));
    }
    float gt = time_med([&](int c) { CK(cudaGraphLaunch(exec[c], st)); }, 15);
    std::printf("%s %8.1f us  (%.2fx stream; %.2f us per kernel)\n", pdl ? "graphpdl" : "graph   ", gt, gt / stream,
                (gt - stream) / n);
  }
  CK(cudaFuncSetAttribute(stage_kernel_ring, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 << 10));
  for (long long kb : {48LL, 96LL, 192LL}) {
    size_t smem = size_t(kb) << 10;
    int b = 0; CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, stage_kernel_ring, kThreads, smem));
    int g = prop.multiProcessorCount * std::min(b, per_sm);
    cudaGraphExec_t exec[copies];
    for (int c = 0; c < copies; ++c) {
      cudaGraph_t gr; CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
      for (int i = 0; i < n; ++i) {
        cudaLaunchConfig_t cfg = {}; cfg.gridDim = g; cfg.blockDim = kThreads; cfg.stream = st; cfg.dynamicSmemBytes = smem;
        cudaLaunchAttribute at[1]; at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = at; cfg.numAttrs = 1;
        CK(cudaLaunchKernelEx(&cfg, stage_kernel_ring, (const char*)pool, offs[c * n + i], bytes[i], (long long)smem));
      }
      CK(cudaStreamEndCapture(st, &gr)); CK(cudaGraphInstantiate(&exec[c], gr, 0)); CK(cudaGraphDestroy(gr));
    }
    float gt = time_med([&](int c) { CK(cudaGraphLaunch(exec[c], st)); }, 15);
    std::printf("pdl+ring %8.1f us  (%.2fx stream; %d blocks of %lld KB rings, loaded before the wait)\n", gt, gt / stream, g, kb);
  }
  CK(cudaDeviceSynchronize());
  return 0;
}
