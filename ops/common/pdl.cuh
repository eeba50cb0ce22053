// Programmatic dependent launch (PDL) hooks of the standalone kernels (the body contract's
// PdlWait, common/body.cuh, calls the wait).
#pragma once

namespace encore::device {

// Waits until the previous kernel in the stream has flushed its results (no-op when the kernel
// was not launched as a dependent). Call before the first load of upstream data.
__device__ __forceinline__ void wait_for_upstream() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
// Lets the next kernel in the stream start its prologue (weight prefetch) now.
__device__ __forceinline__ void allow_downstream() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

}  // namespace encore::device
