// Host-side helpers shared by every launcher: CUDA error mapping, argument checks, device facts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include <cuda_runtime.h>

#include <encore/status.h>

namespace encore::detail {

Status cuda_status(cudaError_t err, const char* what);

// A stream is usable when no error is pending on the context and, if it is being captured,
// the capture has not been invalidated. Safe to call during stream capture.
Status check_stream(cudaStream_t stream);

// The last-error check every launcher runs right after its launch.
Status check_launch(const char* kernel_name);

// "<op>: <name> is null" / "must be N-byte aligned".
Status check_pointer(const char* op, const void* ptr, std::size_t alignment, const char* name);

// A named byte range of an op's argument; a null ptr is skipped by the checks.
struct BufferSpan {
  const void* ptr;
  std::size_t bytes;
  const char* name;
};
// kOverlap ("<op>: <a> and <b> overlap") when the two ranges share a byte.
Status check_disjoint(const char* op, const BufferSpan& a, const BufferSpan& b);
// Every output against every input and every other output.
Status check_disjoint(const char* op, std::initializer_list<BufferSpan> inputs, std::initializer_list<BufferSpan> outputs);

// Multiprocessor count of the current device (cached per device).
int sm_count();
// Opt-in shared memory per block of the current device (cached per device).
int max_shared_memory_per_block();
// The most dynamic shared memory each of `blocks_per_sm` co-resident blocks can have.
int max_shared_memory_per_block(int blocks_per_sm);

}  // namespace encore::detail

#define ENCORE_CUDA_TRY(call) ENCORE_RETURN_IF_ERROR(::encore::detail::cuda_status((call), #call))
