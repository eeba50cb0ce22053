#include "common/cuda_check.h"

#include <array>
#include <mutex>

namespace encore::detail {

Status cuda_status(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return {};
  return Status(StatusCode::kCudaError, concat(what, ": ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ")"));
}

Status check_stream(cudaStream_t stream) {
  ENCORE_RETURN_IF_ERROR(cuda_status(cudaPeekAtLastError(), "pending error on the CUDA context"));
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  ENCORE_CUDA_TRY(cudaStreamIsCapturing(stream, &capture));
  ENCORE_REQUIRE(capture != cudaStreamCaptureStatusInvalidated, StatusCode::kCudaError,
                 "the stream's graph capture has been invalidated; nothing was launched");
  return {};
}

Status check_launch(const char* kernel_name) {
  return cuda_status(cudaGetLastError(), kernel_name);
}

Status check_pointer(const void* ptr, std::size_t alignment, const char* name) {
  ENCORE_REQUIRE(ptr != nullptr, StatusCode::kNullPointer, name, " is null");
  ENCORE_REQUIRE(reinterpret_cast<std::uintptr_t>(ptr) % alignment == 0, StatusCode::kMisaligned, name,
                 " must be ", alignment, "-byte aligned (got ", ptr, ")");
  return {};
}

Status check_no_overlap(const void* a, std::size_t a_bytes, const char* a_name, const void* b,
                        std::size_t b_bytes, const char* b_name) {
  auto a0 = reinterpret_cast<std::uintptr_t>(a), b0 = reinterpret_cast<std::uintptr_t>(b);
  bool disjoint = a0 + a_bytes <= b0 || b0 + b_bytes <= a0;
  ENCORE_REQUIRE(disjoint, StatusCode::kOverlap, a_name, " and ", b_name, " overlap");
  return {};
}

namespace {
constexpr int kMaxDevices = 64;
struct DeviceFacts {
  int sms = 0;
  int smem_optin = 0;
};
DeviceFacts facts_of_current_device() {
  static std::array<DeviceFacts, kMaxDevices> cache{};
  static std::mutex mutex;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kMaxDevices) return {132, 232448};
  std::lock_guard lock(mutex);
  DeviceFacts& f = cache[device];
  if (f.sms == 0) {
    cudaDeviceGetAttribute(&f.sms, cudaDevAttrMultiProcessorCount, device);
    cudaDeviceGetAttribute(&f.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  }
  return f;
}
}  // namespace

int sm_count() { return facts_of_current_device().sms; }
int max_shared_memory_per_block() { return facts_of_current_device().smem_optin; }

}  // namespace encore::detail
