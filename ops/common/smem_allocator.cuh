// Carves a body's pieces out of the one dynamic shared-memory buffer (common/body.cuh).
#pragma once

#include <cstddef>

namespace encore::device {

// Each body asks for its pieces in order, so its total need is computed on the host with the
// same code (pass a null base).
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

}  // namespace encore::device
