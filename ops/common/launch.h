// The one launch helper every standalone kernel goes through.
#pragma once

#include <cstddef>
#include <utility>

#include <cuda_runtime.h>

#include <encore/status.h>

#include "common/block.h"
#include "common/cuda_check.h"

namespace encore::detail {

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

}  // namespace encore::detail
