// What does code cost that an SM has not run recently? The megakernel runs a layer's bodies one
// after another on every SM, about 300 KB of SASS per layer (docs/megakernel.md §4), and a block
// that reaches a body after its producers are done spends 5-6 us before it reaches its wait
// (bench/notes/2026-12-05-evening-session.md §6), where the work before the wait is a few hundred
// instructions. This probe times straight-line code with no memory traffic, on one 256-thread
// block per SM (the megakernel's shape), so the instruction fetch is all that differs:
//   first   a body no SM has run yet (its code comes from device memory or L2)
//   warm    the same body again at once (from the SM's instruction caches)
//   evicted the same body after kBodies - 1 others of the same size ran (from L2 when the set is
//           larger than the SM's instruction caches)
// for bodies of three sizes. Each body is kOps rounds of a shift-add-xor over eight registers,
// two SASS instructions per round (16 bytes each), which no compiler can fold. Medians over blocks.
// Then the capacity: a 16 KB body again after n others of 16 KB ran (a working set of n + 1
// bodies), n = 1 .. kSweepBodies - 1: where the time jumps, the set no longer fits the SM's caches.
//   encore_icache_probe [repeats]
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <utility>
#include <vector>

#include <cuda_runtime.h>

#include "probe_check.h"

namespace {

constexpr int kBodies = 8;  // bodies per size class; a set of 8 x 32 KB exceeds any SM's instruction cache
constexpr int kSweepBodies = 16;  // bodies of the capacity sweep (16 KB each)
constexpr int kSweepOps = 512;
constexpr int kThreads = 256;

__device__ __forceinline__ std::uint64_t global_ns() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// kOps rounds of straight-line code; kId makes every body's constants (and so its code) distinct.
template <int kId, int kOps>
__device__ __noinline__ std::uint32_t body(std::uint32_t seed) {
  std::uint32_t r[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) r[j] = seed * std::uint32_t(2 * j + 1) + std::uint32_t(kId);
#pragma unroll
  for (int i = 0; i < kOps; ++i) r[i % 8] ^= (r[(i + 3) % 8] >> (1 + (i * 7 + kId) % 29)) + r[(i + 5) % 8];
  std::uint32_t x = 0;
#pragma unroll
  for (int j = 0; j < 8; ++j) x ^= r[j];
  return x;
}

template <int kOps, int... kIds>
__device__ std::uint32_t call(int which, std::uint32_t seed, std::integer_sequence<int, kIds...>) {
  std::uint32_t x = 0;
  ((which == kIds ? (x = body<kIds + 100 * (kOps % 97), kOps>(seed), 0) : 0), ...);
  return x;
}

// Times body `which` of the class (thread 0's view, between block barriers), in ns.
template <int kOps, int kCount = kBodies>
__device__ std::uint64_t timed(int which, std::uint32_t seed, std::uint32_t& sink) {
  __syncthreads();
  const std::uint64_t t0 = global_ns();
  // The body's input is produced after the first timer read and its result consumed before the
  // second (volatile asm keeps its order): the body runs between them.
  std::uint32_t s;
  asm volatile("mov.u32 %0, %1;" : "=r"(s) : "r"(seed));
  const std::uint32_t x = call<kOps>(which, s, std::make_integer_sequence<int, kCount>{});
  asm volatile("" ::"r"(x));
  sink ^= x;
  __syncthreads();
  return global_ns() - t0;
}

// out[block][3]: first, warm, evicted (ns) of body 0 of the class.
template <int kOps>
__global__ void __launch_bounds__(kThreads, 1) probe(std::uint64_t* out, std::uint32_t* sink_out, std::uint32_t seed) {
  std::uint32_t sink = 0;
  const std::uint32_t s = seed + threadIdx.x;
  const std::uint64_t first = timed<kOps>(0, s, sink);
  const std::uint64_t warm = timed<kOps>(0, s, sink);
  for (int b = 1; b < kBodies; ++b) timed<kOps>(b, s, sink);
  const std::uint64_t evicted = timed<kOps>(0, s, sink);
  if (threadIdx.x == 0) {
    out[blockIdx.x * 3 + 0] = first;
    out[blockIdx.x * 3 + 1] = warm;
    out[blockIdx.x * 3 + 2] = evicted;
  }
  if (sink == 0x12345678u) sink_out[blockIdx.x] = sink;  // keeps the bodies alive
}

// out[block][2]: warm and after `others` other bodies (ns) of sweep body 0.
__global__ void __launch_bounds__(kThreads, 1) sweep(int others, std::uint64_t* out, std::uint32_t* sink_out, std::uint32_t seed) {
  std::uint32_t sink = 0;
  const std::uint32_t s = seed + threadIdx.x;
  timed<kSweepOps, kSweepBodies>(0, s, sink);
  const std::uint64_t warm = timed<kSweepOps, kSweepBodies>(0, s, sink);
  for (int b = 1; b <= others; ++b) timed<kSweepOps, kSweepBodies>(b, s, sink);
  const std::uint64_t after = timed<kSweepOps, kSweepBodies>(0, s, sink);
  if (threadIdx.x == 0) out[blockIdx.x * 2] = warm, out[blockIdx.x * 2 + 1] = after;
  if (sink == 0x12345678u) sink_out[blockIdx.x] = sink;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

template <int kOps>
void run_class(int sms, int repeats) {
  std::uint64_t* out = nullptr;
  std::uint32_t* sink = nullptr;
  PROBE_CHECK(cudaMalloc(&out, sizeof(std::uint64_t) * 3 * sms));
  PROBE_CHECK(cudaMalloc(&sink, sizeof(std::uint32_t) * sms));
  std::vector<std::uint64_t> host(3 * sms);
  // A fresh launch re-runs the code from L2 (or device memory) on each SM; repeats give medians.
  std::vector<double> first, warm, evicted;
  for (int r = 0; r < repeats; ++r) {
    probe<kOps><<<sms, kThreads>>>(out, sink, 17u + r);
    PROBE_CHECK(cudaGetLastError());
    PROBE_CHECK(cudaDeviceSynchronize());
    PROBE_CHECK(cudaMemcpy(host.data(), out, sizeof(std::uint64_t) * 3 * sms, cudaMemcpyDeviceToHost));
    for (int b = 0; b < sms; ++b) {
      first.push_back(host[3 * b] * 1e-3);
      warm.push_back(host[3 * b + 1] * 1e-3);
      evicted.push_back(host[3 * b + 2] * 1e-3);
    }
  }
  const double kb = kOps * 2 * 16 / 1024.0;  // two 16-byte instructions per round (check: cuobjdump -sass)
  std::printf("| %d rounds (~%.0f KB) | %.2f | %.2f | %.2f | %.1f |\n", kOps, kb, median(first), median(warm), median(evicted),
              (median(evicted) - median(warm)) / kb * 1e3);
  PROBE_CHECK(cudaFree(out));
  PROBE_CHECK(cudaFree(sink));
}

}  // namespace

int main(int argc, char** argv) {
  const int repeats = argc > 1 ? std::atoi(argv[1]) : 5;
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    std::fprintf(stderr, "encore_icache_probe: no CUDA device\n");
    return 1;
  }
  cudaDeviceProp prop{};
  PROBE_CHECK(cudaGetDeviceProperties(&prop, device));
  std::printf("%s, %d SMs, one block of %d threads per SM, %d bodies per class, medians over %d launches x %d blocks\n\n",
              prop.name, sms, kThreads, kBodies, repeats, sms);
  std::printf("| body | first us | warm us | evicted us | evicted - warm, ns per KB |\n|---|---|---|---|---|\n");
  run_class<256>(sms, repeats);
  run_class<1024>(sms, repeats);
  run_class<4096>(sms, repeats);

  std::printf("\n| working set (16 KB bodies) | warm us | body 0 again us | extra ns per KB |\n|---|---|---|---|\n");
  std::uint64_t* out = nullptr;
  std::uint32_t* sink = nullptr;
  PROBE_CHECK(cudaMalloc(&out, sizeof(std::uint64_t) * 2 * sms));
  PROBE_CHECK(cudaMalloc(&sink, sizeof(std::uint32_t) * sms));
  std::vector<std::uint64_t> host(2 * sms);
  for (int others = 1; others < kSweepBodies; ++others) {
    std::vector<double> warm, after;
    for (int r = 0; r < repeats; ++r) {
      sweep<<<sms, kThreads>>>(others, out, sink, 91u + r);
      PROBE_CHECK(cudaGetLastError());
      PROBE_CHECK(cudaDeviceSynchronize());
      PROBE_CHECK(cudaMemcpy(host.data(), out, sizeof(std::uint64_t) * 2 * sms, cudaMemcpyDeviceToHost));
      for (int b = 0; b < sms; ++b) warm.push_back(host[2 * b] * 1e-3), after.push_back(host[2 * b + 1] * 1e-3);
    }
    const double kb = kSweepOps * 2 * 16 / 1024.0;
    std::printf("| %d KB | %.2f | %.2f | %.1f |\n", (others + 1) * 16, median(warm), median(after),
                (median(after) - median(warm)) / kb * 1e3);
  }
  PROBE_CHECK(cudaFree(out));
  PROBE_CHECK(cudaFree(sink));
  return 0;
}
