// The probes' CUDA error check: print the call and the error, exit (a probe has nothing to unwind).
#pragma once

#include <cstdio>
#include <cstdlib>

#include <cuda_runtime.h>

#define PROBE_CHECK(call)                                                                        \
  do {                                                                                           \
    const cudaError_t e = (call);                                                                \
    if (e != cudaSuccess) {                                                                      \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e)); \
      std::exit(1);                                                                              \
    }                                                                                            \
  } while (0)
