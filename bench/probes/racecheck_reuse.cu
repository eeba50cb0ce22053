// Does compute-sanitizer racecheck follow shared memory handed from one body to the next, the way
// the megakernel hands it over? A "body" gives every warp a ring of `slots` buffers behind
// mbarriers at the start of shared memory, streams `pieces` pieces through it with bulk copies
// (lanes copy rows), waits for and reads each piece, and invalidates its barriers at the end.
// Between two bodies every thread fences the async proxy and the block synchronises. Every copy
// has completed and been waited for before the barrier, so no access races.
//   encore_racecheck_probe reuse     body B re-initialises barriers and copies over body A's bytes
//   encore_racecheck_probe alone     body A only
//   encore_racecheck_probe disjoint  body B on bytes of its own
//   encore_racecheck_probe written   body A stores plainly (as the GEMV's activation prologue does),
//                                    body B copies over those bytes
//   encore_racecheck_probe stored    body B stores plainly over body A's copied bytes
//   encore_racecheck_probe stored_whole  the same, body A's lane 0 copying each buffer whole (one
//                                    copy per fill, as the GEMV's whole-row slots do)
// Run each under `compute-sanitizer --tool racecheck` (bench/notes/2026-12-05-evening-session.md).
#include <cstdint>
#include <cstdio>
#include <cstring>

#include <cuda_runtime.h>

#include "common/async_copy.cuh"
#include "common/body.cuh"

namespace {

using namespace encore::device;  // the bodies' own barrier and copy helpers (ops/common/)

constexpr int kRowBytes = 128;
extern __shared__ __align__(1024) char smem[];

struct Body {
  int slots, rows, pieces;
  int bar_offset, ring_offset;  // bytes into the block's shared memory
  int rotate;                   // row r of a buffer is copied by lane (r + rotate) % rows: other lanes than body A's
  bool whole = false;           // lane 0 copies the buffer's rows in one copy
};

__device__ float run_body(const char* src, const Body& b) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  std::uint64_t* bars = reinterpret_cast<std::uint64_t*>(smem + b.bar_offset) + warp * b.slots;
  char* ring = smem + b.ring_offset + warp * b.slots * b.rows * kRowBytes;
  if (lane == 0) {
    for (int i = 0; i < b.slots; ++i) barrier_init(&bars[i], 1);
    fence_barrier_init();
  }
  __syncwarp();
  int issued = 0;
  auto fill = [&]() {
    if (issued >= b.pieces) return;
    const int slot = issued % b.slots;
    if (lane == 0) barrier_arrive_expect(&bars[slot], b.rows * kRowBytes);
    if (b.whole) {
      if (lane == 0)
        bulk_copy_to_shared(ring + slot * b.rows * kRowBytes, src + issued % (256 / b.rows) * b.rows * kRowBytes,
                            b.rows * kRowBytes, &bars[slot]);
    } else {
      for (int r = lane; r < b.rows; r += 32)
        bulk_copy_to_shared(ring + (slot * b.rows + (r + b.rotate) % b.rows) * kRowBytes,
                            src + (issued * b.rows + r) % 256 * kRowBytes, kRowBytes, &bars[slot]);
    }
    ++issued;
  };
  for (int i = 0; i < b.slots; ++i) fill();
  float sum = 0.f;
  for (int k = 0; k < b.pieces; ++k) {
    const int slot = k % b.slots;
    barrier_wait(&bars[slot], (k / b.slots) & 1);
    sum += reinterpret_cast<const float*>(ring + slot * b.rows * kRowBytes)[lane * 7 % (b.rows * kRowBytes / 4)];
    __syncwarp();  // every lane is done with the buffer before it is refilled
    fill();
  }
  __syncwarp();
  if (lane == 0) barrier_inval(bars, b.slots);
  return sum;
}

// A body that writes its bytes with ordinary stores and reads them back after a block barrier.
__device__ float store_body(int offset, int bytes) {
  float* values = reinterpret_cast<float*>(smem + offset);
  for (int i = threadIdx.x; i < bytes / 4; i += blockDim.x) values[i] = float(i);
  __syncthreads();
  return values[threadIdx.x * 7 % (bytes / 4)];
}

__device__ void between_bodies() {
  fence_proxy_async();
  __syncthreads();
}

enum Mode { kReuse, kAlone, kDisjoint, kWritten, kStored, kStoredWhole };
constexpr int kSmemBytes = 64 * 1024;

__global__ void probe_kernel(const char* src, float* out, Mode mode) {
  // body A: bytes 1 KB .. 25 KB, stored plainly (written) or through a ring of copies
  float sum = mode == kWritten ? store_body(1024, 24 * 1024) : run_body(src, Body{3, 8, 7, 0, 1024, 0, mode == kStoredWhole});
  between_bodies();
  if (mode == kReuse || mode == kWritten) sum += run_body(src, Body{5, 4, 9, 0, 1024, 1});
  if (mode == kStored || mode == kStoredWhole) sum += store_body(1024, 24 * 1024);
  if (mode == kDisjoint) sum += run_body(src, Body{5, 4, 9, 512, 32 * 1024, 1});  // ring: 32 KB .. 52 KB
  between_bodies();
  out[blockIdx.x * blockDim.x + threadIdx.x] = sum;
}

bool ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) std::fprintf(stderr, "racecheck_reuse: %s: %s\n", what, cudaGetErrorString(e));
  return e == cudaSuccess;
}

}  // namespace

int main(int argc, char** argv) {
  const char* name = argc > 1 ? argv[1] : "reuse";
  const Mode mode = std::strcmp(name, "alone") == 0          ? kAlone
                    : std::strcmp(name, "disjoint") == 0     ? kDisjoint
                    : std::strcmp(name, "written") == 0      ? kWritten
                    : std::strcmp(name, "stored") == 0       ? kStored
                    : std::strcmp(name, "stored_whole") == 0 ? kStoredWhole
                                                             : kReuse;
  if (argc > 1 && mode == kReuse && std::strcmp(name, "reuse") != 0) {
    std::fprintf(stderr, "usage: encore_racecheck_probe [reuse|alone|disjoint|written|stored|stored_whole]\n");
    return 2;
  }
  constexpr int kBlocks = 4, kThreads = 256;
  char* src = nullptr;
  float* out = nullptr;
  if (!ok(cudaMalloc(&src, 256 * kRowBytes), "cudaMalloc") || !ok(cudaMemset(src, 1, 256 * kRowBytes), "cudaMemset") ||
      !ok(cudaMalloc(&out, kBlocks * kThreads * sizeof(float)), "cudaMalloc") ||
      !ok(cudaFuncSetAttribute(probe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes), "cudaFuncSetAttribute"))
    return 1;
  probe_kernel<<<kBlocks, kThreads, kSmemBytes>>>(src, out, mode);
  if (!ok(cudaGetLastError(), "launch") || !ok(cudaDeviceSynchronize(), "kernel")) return 1;
  std::printf("racecheck_reuse %s: ran\n", name);
  return ok(cudaFree(src), "cudaFree") && ok(cudaFree(out), "cudaFree") ? 0 : 1;
}
