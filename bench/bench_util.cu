#include "bench_util.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>

namespace encore::bench {

void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    std::fprintf(stderr, "encore_bench: %s failed: %s\n", what, cudaGetErrorString(err));
    std::exit(2);
  }
}

namespace {

__device__ __forceinline__ std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

__global__ void fill_bytes_kernel(std::uint64_t* p, std::size_t words, std::uint64_t seed) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < words; i += std::size_t(gridDim.x) * blockDim.x)
    p[i] = splitmix64(seed ^ (i * 0xD1B54A32D192ED03ull));
}

__global__ void fill_floats_kernel(float* p, std::size_t n, std::uint64_t seed, float lo, float hi) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x) {
    float u = float(splitmix64(seed ^ (i * 0xD1B54A32D192ED03ull)) >> 40) * (1.f / 16777216.f);
    p[i] = lo + (hi - lo) * u;
  }
}

// Read-only stream: every block sums its slice with 16-byte loads; one store per block keeps
// the loads alive.
__global__ void read_kernel(const uint4* __restrict__ p, std::size_t n, unsigned* sink) {
  unsigned acc = 0;
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x) {
    uint4 v = __ldcs(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) sink[blockIdx.x] = acc;
}

std::vector<std::unique_ptr<void, void (*)(void*)>>& allocations() {
  static std::vector<std::unique_ptr<void, void (*)(void*)>> list;
  return list;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

template <class F>
double median_ms(F&& body, int reps) {
  cudaEvent_t a, b;
  BENCH_CUDA(cudaEventCreate(&a));
  BENCH_CUDA(cudaEventCreate(&b));
  body();  // warm-up
  std::vector<double> ms;
  for (int r = 0; r < reps; ++r) {
    BENCH_CUDA(cudaEventRecord(a));
    body();
    BENCH_CUDA(cudaEventRecord(b));
    BENCH_CUDA(cudaEventSynchronize(b));
    float t = 0;
    BENCH_CUDA(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return median(ms);
}

DeviceFacts measure() {
  DeviceFacts f;
  int dev = 0;
  BENCH_CUDA(cudaGetDevice(&dev));
  cudaDeviceProp prop{};
  BENCH_CUDA(cudaGetDeviceProperties(&prop, dev));
  f.name = prop.name;
  f.sms = prop.multiProcessorCount;
  f.l2_bytes = prop.l2CacheSize;

  const std::size_t bytes = std::size_t(2) << 30;
  void* buf = device_alloc(bytes);
  void* dst = device_alloc(bytes / 2);
  unsigned* sink = static_cast<unsigned*>(device_alloc(sizeof(unsigned) * 4096));
  fill_random_bytes(buf, bytes, 1);
  double read_ms = median_ms([&] { read_kernel<<<f.sms * 8, 512>>>(static_cast<const uint4*>(buf), bytes / 16, sink); }, 15);
  double copy_ms = median_ms([&] { BENCH_CUDA(cudaMemcpyAsync(dst, buf, bytes / 2, cudaMemcpyDeviceToDevice)); }, 15);
  BENCH_CUDA(cudaGetLastError());
  f.read_bw_bytes_per_s = bytes / (read_ms * 1e-3);
  f.copy_bw_bytes_per_s = 2.0 * (bytes / 2) / (copy_ms * 1e-3);
  return f;
}

}  // namespace

const DeviceFacts& device_facts() {
  static DeviceFacts facts = measure();
  return facts;
}

void* device_alloc(std::size_t bytes) {
  void* p = nullptr;
  BENCH_CUDA(cudaMalloc(&p, bytes));
  allocations().emplace_back(p, [](void* q) { cudaFree(q); });
  return p;
}

DeviceMemory::DeviceMemory(std::size_t bytes) { BENCH_CUDA(cudaMalloc(&ptr_, bytes)); }
DeviceMemory::~DeviceMemory() { cudaFree(ptr_); }

pipeline::StepInputs decode_inputs(int batch, int context, int pages_per_seq, int vocab) {
  pipeline::StepInputs in;
  for (int b = 0; b < batch; ++b) {
    in.token_ids.push_back((1009 * b + 17) % vocab);
    in.positions.push_back(context - 1);
    in.seq_lens.push_back(context);
    in.slot_ids.push_back(b);
    for (int i = 0; i < pages_per_seq; ++i) in.block_table.push_back(b * pages_per_seq + i);
  }
  return in;
}

void fill_random_bytes(void* ptr, std::size_t bytes, std::uint64_t seed) {
  fill_bytes_kernel<<<1024, 256>>>(static_cast<std::uint64_t*>(ptr), bytes / 8, seed);
  BENCH_CUDA(cudaGetLastError());
}

void fill_random_floats(float* ptr, std::size_t count, std::uint64_t seed, float lo, float hi) {
  fill_floats_kernel<<<1024, 256>>>(ptr, count, seed, lo, hi);
  BENCH_CUDA(cudaGetLastError());
}

int rotation_count(std::size_t bytes) {
  std::size_t target = 4 * std::max<std::size_t>(device_facts().l2_bytes, 50u << 20);
  return int(std::max<std::size_t>(2, (target + bytes - 1) / std::max<std::size_t>(bytes, 1)));
}

void time_graph(benchmark::State& state, const std::function<void(int, cudaStream_t)>& enqueue, int calls,
                double bytes_per_call, Roof roof) {
  cudaStream_t stream;
  BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  BENCH_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < calls; ++i) enqueue(i, stream);
  BENCH_CUDA(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  BENCH_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t a, b;
  BENCH_CUDA(cudaEventCreate(&a));
  BENCH_CUDA(cudaEventCreate(&b));
  BENCH_CUDA(cudaGraphLaunch(exec, stream));  // warm-up
  BENCH_CUDA(cudaStreamSynchronize(stream));
  std::vector<double> per_call_s;
  for (auto _ : state) {
    BENCH_CUDA(cudaEventRecord(a, stream));
    BENCH_CUDA(cudaGraphLaunch(exec, stream));
    BENCH_CUDA(cudaEventRecord(b, stream));
    BENCH_CUDA(cudaEventSynchronize(b));
    float ms = 0;
    BENCH_CUDA(cudaEventElapsedTime(&ms, a, b));
    // The iteration is the whole graph (so Google Benchmark's iteration count tracks real time);
    // the per-call median goes into the counters.
    per_call_s.push_back(ms * 1e-3 / calls);
    state.SetIterationTime(ms * 1e-3);
  }
  BENCH_CUDA(cudaGetLastError());
  double med = median(per_call_s);
  const DeviceFacts& f = device_facts();
  double bw = bytes_per_call / med;
  double roof_bw = roof == Roof::kRead ? f.read_bw_bytes_per_s : f.copy_bw_bytes_per_s;
  state.counters["us_median"] = med * 1e6;
  state.counters["GB/s"] = bw * 1e-9;
  state.counters[roof == Roof::kRead ? "%read_bw" : "%copy_bw"] = 100.0 * bw / roof_bw;
  state.counters["MB"] = bytes_per_call * 1e-6;
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

}  // namespace encore::bench
