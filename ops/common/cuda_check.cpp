#include "common/cuda_check.h"

#include <algorithm>
#include <array>
#include <mutex>

namespace encore::detail {

Status cuda_status(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return {};
  // Without a GPU (or a driver for it) every runtime call reports one of these.
  const bool no_device = err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver;
  return Status(no_device ? StatusCode::kNoDevice : StatusCode::kCudaError, concat(what, ": ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ")"));
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

Status check_pointer(const char* op, const void* ptr, std::size_t alignment, const char* name) {
  ENCORE_REQUIRE(ptr != nullptr, StatusCode::kNullPointer, op, ": ", name, " is null");
  ENCORE_REQUIRE(reinterpret_cast<std::uintptr_t>(ptr) % alignment == 0, StatusCode::kMisaligned, op, ": ", name,
                 " must be ", alignment, "-byte aligned (got ", ptr, ")");
  return {};
}

Status check_disjoint(const char* op, const BufferSpan& a, const BufferSpan& b) {
  if (!a.ptr || !b.ptr) return {};
  const auto a0 = reinterpret_cast<std::uintptr_t>(a.ptr), b0 = reinterpret_cast<std::uintptr_t>(b.ptr);
  const bool disjoint = a0 + a.bytes <= b0 || b0 + b.bytes <= a0;
  ENCORE_REQUIRE(disjoint, StatusCode::kOverlap, op, ": ", a.name, " and ", b.name, " overlap");
  return {};
}

Status check_disjoint(const char* op, std::initializer_list<BufferSpan> inputs, std::initializer_list<BufferSpan> outputs) {
  for (auto out = outputs.begin(); out != outputs.end(); ++out) {
    for (const BufferSpan& in : inputs) ENCORE_RETURN_IF_ERROR(check_disjoint(op, in, *out));
    for (auto other = outputs.begin(); other != out; ++other) ENCORE_RETURN_IF_ERROR(check_disjoint(op, *other, *out));
  }
  return {};
}

namespace {
constexpr int kMaxDevices = 64;
struct DeviceFacts {
  int sms = 0;
  int smem_optin = 0;
  int smem_per_sm = 0;
  int smem_reserved_per_block = 0;
};
DeviceFacts facts_of_current_device() {
  static std::array<DeviceFacts, kMaxDevices> cache{};
  static std::mutex mutex;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kMaxDevices) return {132, 232448, 233472, 1024};
  std::lock_guard lock(mutex);
  DeviceFacts& f = cache[device];
  if (f.sms == 0) {
    cudaDeviceGetAttribute(&f.sms, cudaDevAttrMultiProcessorCount, device);
    cudaDeviceGetAttribute(&f.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    cudaDeviceGetAttribute(&f.smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device);
    cudaDeviceGetAttribute(&f.smem_reserved_per_block, cudaDevAttrReservedSharedMemoryPerBlock, device);
  }
  return f;
}
}  // namespace

int sm_count() { return facts_of_current_device().sms; }
int max_shared_memory_per_block() { return facts_of_current_device().smem_optin; }
int max_shared_memory_per_block(int blocks_per_sm) {
  const DeviceFacts f = facts_of_current_device();
  if (blocks_per_sm <= 1) return f.smem_optin;
  return std::min(f.smem_optin, f.smem_per_sm / blocks_per_sm - f.smem_reserved_per_block);
}

}  // namespace encore::detail
