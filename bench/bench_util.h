// Shared benchmark plumbing: the device's measured read bandwidth, graph-replayed timing with
// CUDA events, rotation of buffers beyond L2, and the GB/s + %-of-bandwidth counters.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <encore/pipeline/pipeline.h>

namespace encore::bench {

struct DeviceFacts {
  std::string name;
  int sms = 0;
  std::size_t l2_bytes = 0;
  double read_bw_bytes_per_s = 0;  // measured at start-up: read-only stream over 2 GiB
  double copy_bw_bytes_per_s = 0;  // measured at start-up: device-to-device copy, read + write
};

// Measured once per process (bench main calls it before any benchmark runs).
const DeviceFacts& device_facts();

void check_cuda(cudaError_t err, const char* what);
#define BENCH_CUDA(call) ::encore::bench::check_cuda((call), #call)

// Number of copies of a `bytes`-sized working set needed so that the rotation covers at least
// 4x the L2 (at least 2 copies).
int rotation_count(std::size_t bytes);

// Times `enqueue(i)` for i = 0..calls-1 captured into one CUDA graph, replayed `state`'s
// iterations (one iteration = one replay of the whole graph, timed with events: register with
// UseManualTime()). Counters: us_median = median time per call, GB/s over `bytes_per_call`, and %
// of the measured read (or copy) bandwidth.
enum class Roof { kRead, kCopy };
void time_graph(benchmark::State& state, const std::function<void(int, cudaStream_t)>& enqueue, int calls,
                double bytes_per_call, Roof roof = Roof::kRead);

// Device allocation owned by the benchmark process, freed at exit.
void* device_alloc(std::size_t bytes);

// Device allocation owned by one benchmark (freed when it goes out of scope).
class DeviceMemory {
 public:
  explicit DeviceMemory(std::size_t bytes);
  ~DeviceMemory();
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  template <class T = void>
  T* as() const { return static_cast<T*>(ptr_); }

 private:
  void* ptr_ = nullptr;
};

// Calls per captured graph: a multiple of `copies` (the rotation) with at least `min_calls`.
inline int graph_calls(int copies, int min_calls = 24) { return (min_calls + copies - 1) / copies * copies; }

// A decode step of `batch` sequences at `context` tokens: row b in slot b, pages
// [b * pages_per_seq, (b + 1) * pages_per_seq).
pipeline::StepInputs decode_inputs(int batch, int context, int pages_per_seq, int vocab);

void fill_random_bytes(void* ptr, std::size_t bytes, std::uint64_t seed);
void fill_random_floats(float* ptr, std::size_t count, std::uint64_t seed, float lo = -1.f, float hi = 1.f);

}  // namespace encore::bench
