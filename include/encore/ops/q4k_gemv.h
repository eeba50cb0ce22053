// Q4_K GEMV family for decode (1..32 activation rows; above 16 only where q4k_gemv_max_batch allows):
//   q4k_gemv          y[b] = W x[b]                       (+ residual[b])
//   rmsnorm_q4k_gemv  y[b] = W (rmsnorm(x[b]) * gamma)    (+ residual[b]; optionally writes the normalised x)
//   gate_up_q4k_gemv  h[b] = silu(Wg n[b]) * (Wu n[b]), n = x or rmsnorm(x)*gamma; or raw gate and up
// W is N x K Q4_K (GGUF layout: row r = K/256 consecutive blocks), fp32 activations and outputs.
// Activations are quantised to int8 per 32 values inside the kernel (docs/q4k.md §8); the
// result differs from fp32 math by ~0.5% relative L2 on Gaussian data (see ref::q4k_gemv_int8).
// The int8 dot products run on dp4a (1..4 tokens) or int8 tensor cores (5..16, GemvCore); the fp16
// core takes 5..16 tokens, and 17..32 with one matrix where all of K's activations fit a block.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include <encore/q4k.h>
#include <encore/status.h>

namespace encore::ops {

// Rows of one launch: 1..16 on every core and shape; 17..32 only on the fp16 core (GemvCore::kAuto
// or kMmaF16) with one matrix (plain or RMSNorm, not gate/up) and k <= 2304 (q4k_gemv_max_batch):
// its 32-token tier dequantises each weight once for 32 rows.
inline constexpr int kMaxGemvBatch = 32;

struct Q4kGemvParams {
  const q4k::Block* weight = nullptr;  // [n][k/256], 16-byte aligned
  const float* x = nullptr;            // [batch][x_stride], 16-byte aligned
  float* y = nullptr;                  // [batch][y_stride]
  const float* residual = nullptr;     // optional [batch][y_stride]; may equal y (y += W x)
  std::int64_t n = 0;                  // output rows
  std::int64_t k = 0;                  // inputs, a multiple of 256
  int batch = 1;                       // 1..q4k_gemv_max_batch(k, 1)
  std::int64_t x_stride = 0;           // elements between activation rows (0: k); a multiple of 4
  std::int64_t y_stride = 0;           // elements between output rows (0: n)
};

struct RmsNormQ4kGemvParams {
  const q4k::Block* weight = nullptr;  // [n][k/256]
  const float* x = nullptr;            // [batch][x_stride] un-normalised
  const float* gamma = nullptr;        // [k] norm weight, 16-byte aligned
  float eps = 1e-5f;
  float* y = nullptr;                  // [batch][y_stride]
  const float* residual = nullptr;     // optional, may equal y
  float* normalized = nullptr;         // optional [batch][k]: rmsnorm(x) * gamma
  std::int64_t n = 0, k = 0;
  int batch = 1;
  std::int64_t x_stride = 0, y_stride = 0;
};

enum class GateUpOutput {
  kSiluMul,  // h = silu(gate) * up
  kRaw,      // h = gate, up_out = up
};

struct GateUpQ4kGemvParams {
  const q4k::Block* gate = nullptr;    // [n][k/256]
  const q4k::Block* up = nullptr;      // [n][k/256]
  const float* x = nullptr;            // [batch][x_stride]
  const float* gamma = nullptr;        // optional: RMSNorm prologue when set
  float eps = 1e-5f;
  GateUpOutput output = GateUpOutput::kSiluMul;
  float* h = nullptr;                  // [batch][h_stride]
  float* up_out = nullptr;             // [batch][h_stride], kRaw only
  std::int64_t n = 0, k = 0;
  int batch = 1;
  std::int64_t x_stride = 0, h_stride = 0;
};

// The dot-product core. The int8 cores quantise the activations the same way and differ in the
// order of their fp32 sums; the fp16 core quantises them to fp16. Results agree to rounding, not
// bit for bit.
enum class GemvCore {
  kAuto,  // dp4a below kGemvMmaMinBatch tokens, fp16 mma from there (else int8 mma, else dp4a: the first whose plan fits)
  kDp4a,  // dp4a on CUDA cores, every batch
  kMma,   // int8 mma.sync (docs/q4k.md §9) for batches of 5..16 tokens (its 8 / 16 tiers); dp4a below
  // fp16 mma.sync on sc * q weights and scaled fp16 activations (docs/q4k.md §9.2), 5..32 tokens
  // (17..32: one matrix, where q4k_gemv_max_batch allows);
  // dp4a below. More accurate than the int8 cores (fp16 rounding of each activation, relative
  // 2^-11, against int8's amax / 254), so it rounds differently from them.
  kMmaF16,
};
inline constexpr int kGemvMmaMinBatch = 5;

// Launch options shared by the family.
struct GemvLaunch {
  bool pdl = true;  // launch as a programmatic dependent of the previous kernel in the stream
  GemvCore core = GemvCore::kAuto;
  // mma cores only: warps sharing a 16-row group, each taking a contiguous K range: 1, 2, 4 or 8,
  // or 0 to let the planner choose (a tuning and test hook; results round differently per value).
  int mma_k_parts = 0;
  // Optional device scratch of act_image_bytes (16-byte aligned; kGemvActImageBytes always
  // suffices) for one-matrix launches on the fp16 core: a kernel of its own quantises x once into
  // it (the image of a block's activation region in shared memory), and every block copies the
  // image instead of quantising all of x itself (docs/q4k.md §9.4). The same arithmetic, so the
  // same bits. Ignored by other launches (dp4a, int8 mma, gate/up). Stream-ordered scratch: one
  // buffer can serve every launch of a stream.
  void* act_image = nullptr;
  std::size_t act_image_bytes = 0;
};
inline constexpr std::size_t kGemvActImageBytes = 227 * 1024;  // a block's shared memory at most

// The core a launch with these dims runs for `requested` (the mma cores need their 8 / 16-token
// tiers and all of K's activations in one shared-memory chunk, else dp4a runs; above 16 rows,
// where only the fp16 core may run, kDp4a means the launch is refused). Host only: the choice does
// not depend on the device. num_matrices: 1 (plain, RMSNorm) or 2 (gate/up).
GemvCore q4k_gemv_core(std::int64_t k, int batch, int num_matrices, GemvCore requested = GemvCore::kAuto);

// The most rows one launch of this K takes (kMaxGemvBatch, or 16 where the fp16 core's 32-token
// plan does not fit or num_matrices is 2). Host only. A caller with more rows splits them.
int q4k_gemv_max_batch(std::int64_t k, int num_matrices);

// The launchers' argument checks alone (dims, null / misaligned pointers, overlaps), without a
// device or a launch: a pipeline can check a whole stage table on the host.
Status q4k_gemv_validate(const Q4kGemvParams& p);
Status rmsnorm_q4k_gemv_validate(const RmsNormQ4kGemvParams& p);
Status gate_up_q4k_gemv_validate(const GateUpQ4kGemvParams& p);

Status q4k_gemv(const Q4kGemvParams& p, cudaStream_t stream, GemvLaunch launch = {});
Status rmsnorm_q4k_gemv(const RmsNormQ4kGemvParams& p, cudaStream_t stream, GemvLaunch launch = {});
Status gate_up_q4k_gemv(const GateUpQ4kGemvParams& p, cudaStream_t stream, GemvLaunch launch = {});

}  // namespace encore::ops
