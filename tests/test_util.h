// Shared test helpers: GPU skip, device buffers, fresh random inputs, error norms.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <encore/device.h>
#include <encore/status.h>

// Skips the current test with a one-line reason when no CUDA device is usable.
#define ENCORE_REQUIRE_GPU()                                                        \
  do {                                                                              \
    std::string encore_why_;                                                        \
    if (!::encore::cuda_device_available(&encore_why_))                             \
      GTEST_SKIP() << "GPU test skipped: " << encore_why_;                          \
  } while (0)

#define CUDA_OK(expr) ASSERT_EQ(cudaSuccess, (expr)) << #expr << ": " << cudaGetErrorString(cudaGetLastError())
#define ENCORE_OK(expr)                                         \
  do {                                                          \
    ::encore::Status encore_st_ = (expr);                       \
    ASSERT_TRUE(encore_st_.ok()) << encore_st_.to_string();     \
  } while (0)

namespace encore::test {

// Owning device allocation; memory is NaN-poisoned (all bytes 0xFF) on creation.
template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t count) : count_(count) {
    if (count_ && cudaMalloc(&ptr_, bytes()) != cudaSuccess) {
      ptr_ = nullptr;
      ADD_FAILURE() << "cudaMalloc of " << bytes() << " bytes failed";
      return;
    }
    poison();
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { upload(host); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(count_, o.count_);
    return *this;
  }
  ~DeviceBuffer() { if (ptr_) cudaFree(ptr_); }

  T* get() const { return ptr_; }
  std::size_t size() const { return count_; }
  std::size_t bytes() const { return count_ * sizeof(T); }

  void upload(const std::vector<T>& host) {
    EXPECT_EQ(host.size(), count_);
    EXPECT_EQ(cudaSuccess, cudaMemcpy(ptr_, host.data(), bytes(), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> host(count_);
    EXPECT_EQ(cudaSuccess, cudaDeviceSynchronize());
    EXPECT_EQ(cudaSuccess, cudaMemcpy(host.data(), ptr_, bytes(), cudaMemcpyDeviceToHost));
    return host;
  }
  // Every byte 0xFF: NaN for fp32/bf16/fp16, -1 for integers. Synchronous: the memset runs on the
  // legacy stream, which work on cudaStreamNonBlocking streams (graph replays) does not wait for.
  void poison() {
    EXPECT_EQ(cudaSuccess, cudaMemset(ptr_, 0xFF, bytes()));
    EXPECT_EQ(cudaSuccess, cudaDeviceSynchronize());
  }

 private:
  T* ptr_ = nullptr;
  std::size_t count_ = 0;
};

// An integer from the environment, or `fallback` when it is unset or not a number.
inline long long env_int(const char* name, long long fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const long long x = std::strtoll(v, &end, 0);
  return end && *end == '\0' ? x : fallback;
}

// A fresh seed every run (reported on failure through the test's SCOPED_TRACE); ENCORE_TEST_SEED
// replays a reported one.
inline std::uint64_t fresh_seed() {
  if (const char* v = std::getenv("ENCORE_TEST_SEED"); v && *v) return std::strtoull(v, nullptr, 0);
  static std::random_device device;
  const std::uint64_t seed = (std::uint64_t(device()) << 32) ^ device();
  // Shown with a failing test's output: rerun it with this variable to draw the same inputs.
  std::printf("[ seed     ] ENCORE_TEST_SEED=0x%llx\n", static_cast<unsigned long long>(seed));
  return seed;
}

// Multiprocessors of the current device (0 without one).
inline int sm_count() {
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
    return 0;
  return sms;
}

inline std::vector<float> random_normal(std::size_t n, std::mt19937_64& rng, float mean = 0.f, float stddev = 1.f) {
  std::normal_distribution<float> dist(mean, stddev);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

inline std::vector<float> random_uniform(std::size_t n, std::mt19937_64& rng, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// ||a - b|| / ||b|| over every element; NaN anywhere in `a` gives +inf so a poisoned, unwritten
// output can never pass.
template <class A, class B>
double rel_l2(const std::vector<A>& a, const std::vector<B>& b) {
  if (a.size() != b.size()) return INFINITY;
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    double x = double(a[i]), y = double(b[i]);
    if (!std::isfinite(x)) return INFINITY;
    num += (x - y) * (x - y);
    den += y * y;
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

inline bool bitwise_equal(const void* a, const void* b, std::size_t bytes) { return std::memcmp(a, b, bytes) == 0; }

}  // namespace encore::test
