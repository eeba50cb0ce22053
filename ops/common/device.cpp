#include <encore/device.h>

#include <cuda_runtime.h>

namespace encore {

bool cuda_device_available(std::string* why) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    if (why) *why = err != cudaSuccess ? std::string("no CUDA device (") + cudaGetErrorString(err) + ")" : "no CUDA device";
    cudaGetLastError();  // clear the non-sticky error so later checks do not see it
    return false;
  }
  return true;
}

}  // namespace encore
