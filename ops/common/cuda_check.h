// Host-side helpers shared by every launcher: CUDA error mapping, argument checks, device facts.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include <encore/status.h>

namespace encore::detail {

Status cuda_status(cudaError_t err, const char* what);

// A stream is usable when no error is pending on the context and, if it is being captured,
// the capture has not been invalidated. Safe to call during stream capture.
Status check_stream(cudaStream_t stream);

// The last-error check every launcher runs right after its launch.
Status check_launch(const char* kernel_name);

Status check_pointer(const void* ptr, std::size_t alignment, const char* name);
Status check_no_overlap(const void* a, std::size_t a_bytes, const char* a_name, const void* b,
                        std::size_t b_bytes, const char* b_name);

// Multiprocessor count of the current device (cached per device).
int sm_count();
// Opt-in shared memory per block of the current device (cached per device).
int max_shared_memory_per_block();

}  // namespace encore::detail

#define ENCORE_CUDA_TRY(call) ENCORE_RETURN_IF_ERROR(::encore::detail::cuda_status((call), #call))
