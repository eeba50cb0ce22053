// Device/launch plumbing shared by every op: the uniform block shape, programmatic dependent
// launch (PDL) hooks, a shared-memory bump allocator, and the one launch helper.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include <encore/status.h>

#include "common/cuda_check.h"

namespace encore {

// Every device body runs with this many threads per block, so the megakernel can call any of them.
inline constexpr int kBlockThreads = 256;
inline constexpr int kWarpsPerBlock = kBlockThreads / 32;

namespace device {

// PDL: wait until the previous kernel in the stream has flushed its results (no-op when the
// kernel was not launched as a dependent). Call before the first load of upstream data.
__device__ __forceinline__ void wait_for_upstream() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
// PDL: let the next kernel in the stream start its prologue (weight prefetch) now.
__device__ __forceinline__ void allow_downstream() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Orders this thread's earlier generic-proxy accesses of shared memory before its later
// async-proxy ones (bulk copies into memory that was just read or written by threads).
__device__ __forceinline__ void fence_proxy_async() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}

// v[0..7] = p[0..7] through the read-only path (p 16-byte aligned, not written by this kernel).
__device__ __forceinline__ void ldg_float8(const float* p, float (&v)[8]) {
  const float4 a = __ldg(reinterpret_cast<const float4*>(p)), b = __ldg(reinterpret_cast<const float4*>(p) + 1);
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

// Carves dynamic shared memory: each body asks for its pieces in order, so its total need can
// be computed on the host with the same code (pass a null base).
class SmemAllocator {
 public:
  __host__ __device__ explicit SmemAllocator(char* base) : base_(base) {}
  template <class T>
  __host__ __device__ T* take(std::size_t count, std::size_t align = 16) {
    offset_ = (offset_ + align - 1) / align * align;
    T* p = reinterpret_cast<T*>(base_ + offset_);
    offset_ += count * sizeof(T);
    return p;
  }
  __host__ __device__ std::size_t used() const { return offset_; }

 private:
  char* base_;
  std::size_t offset_ = 0;
};

}  // namespace device

namespace detail {

// Launches `kernel<<<grid, kBlockThreads, smem, stream>>>(args...)` through cudaLaunchKernelEx,
// as a programmatic dependent of the previous kernel in the stream when `pdl` is set, raising the
// dynamic shared-memory limit when needed; then checks the launch.
template <class... KernelArgs, class... Args>
Status launch(void (*kernel)(KernelArgs...), int grid, std::size_t smem, cudaStream_t stream, bool pdl,
              const char* name, Args&&... args) {
  if (smem > 48 * 1024)
    ENCORE_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(grid);
  config.blockDim = dim3(kBlockThreads);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attr;
  config.numAttrs = pdl ? 1 : 0;
  ENCORE_RETURN_IF_ERROR(cuda_status(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...), name));
  return check_launch(name);
}

}  // namespace detail
}  // namespace encore
