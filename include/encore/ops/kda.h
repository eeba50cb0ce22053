// KDA decode step (Kimi Delta Attention), one new token for `batch` sequences, states updated in
// place: 4-tap causal depthwise conv + SiLU on q, k, v; L2-normalised q (scaled by K^-1/2) and k;
// per-channel decay alpha = exp(-exp(A_log[h]) * softplus(W_fb·f_a + dt_bias)); beta = sigmoid(b);
// gated delta-rule recurrence on the fp32 state; gated output RMSNorm. Exact math:
// docs/kda.md §3. Everything (conv, gates, recurrence, norm) is one kernel.
//
// Layouts (docs/kda.md §4):
//   recurrent state  fp32 [num_slots][num_heads][V][K]  ("V-first": S[k][v] at ((s*H + h)*V + v)*K + k)
//   conv state       fp32 [num_slots][3 taps][3*H*K]    (tap 0 = oldest raw input; channels q|k|v)
//   proj row         fp32 [q H*K | k H*K | v H*K | f_a rank | g_a rank | b H]   (pre-conv values)
//
// Slot ids live in device memory (graph-safe): slot_ids[i] < 0 is a padding row (no state touched,
// y[i] = 0). Validity of device slot ids (range, no duplicates) is checked in one of two ways:
//   * host_slot_ids != nullptr: the launcher checks this host copy before launching (eager use);
//   * error_flag != nullptr: the launcher first enqueues a one-block check kernel that ORs a
//     KdaError code into *error_flag (sticky, the caller clears it); the step kernel reads the flag
//     and, when it is non-zero, writes no state at all and fills y with NaN. Works under graph
//     capture; read the flag after the step with kda_read_error().
// Without either, an out-of-range slot id still cannot write out of bounds (that row is skipped and
// its y is NaN), but duplicate slot ids in one batch are a caller error (undefined state).
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <encore/status.h>

namespace encore::ops {

inline constexpr int kKdaConvTaps = 4;             // conv kernel width W
inline constexpr int kKdaConvHistory = 3;          // W - 1 raw inputs kept per channel
inline constexpr float kKdaNormEps = 1e-5f;        // o_norm eps (Kimi-Linear rms_norm_eps)
inline constexpr float kKdaL2NormEps = 1e-6f;      // q/k L2-norm eps, inside the root

// Bits ORed into the device error flag by the slot check.
enum KdaError : int {
  kKdaSlotOutOfRange = 1,  // some slot_ids[i] >= num_slots
  kKdaSlotDuplicate = 2,   // two rows of the batch name the same slot
};

struct KdaParams {
  // Per-step inputs (device).
  const float* proj = nullptr;       // [batch][proj_stride]; row layout above
  std::int64_t proj_stride = 0;      // floats between rows; multiple of 4, >= kda_proj_width()
  const int* slot_ids = nullptr;     // [batch]; < 0 = padding row
  float* y = nullptr;                // [batch][num_heads * head_dim] gated, normalised head outputs

  // Weights (device).
  const float* conv_weight = nullptr;           // [3*H*K][4] q|k|v channels; tap 3 multiplies x_t
  const float* A_log = nullptr;                 // [H]
  const float* dt_bias = nullptr;               // [H*K], per channel h*K + k
  const __nv_bfloat16* f_b_weight = nullptr;    // [H*K][gate_rank] forget-gate up-projection
  const __nv_bfloat16* g_b_weight = nullptr;    // [H*V][gate_rank] output-gate up-projection (no bias)
  const float* o_norm_weight = nullptr;         // [V], shared by all heads

  // State pools (device, updated in place).
  float* conv_state = nullptr;       // [num_slots][3][3*H*K]
  float* recurrent_state = nullptr;  // [num_slots][H][V][K]

  // Optional validation of the device slot ids (see top of file).
  const int* host_slot_ids = nullptr;  // [batch] host copy of slot_ids, checked by the launcher
  int* error_flag = nullptr;           // device int, sticky KdaError bits

  int batch = 0;       // rows N
  int num_heads = 0;   // H
  int head_dim = 0;    // K = V, 64 or 128
  int gate_rank = 0;   // f_a / g_a width (128 in Kimi-Linear); 64, 128, 192 or 256
  int num_slots = 0;   // capacity of both pools
  float norm_eps = kKdaNormEps;
  // Set when slot_ids and both pools were complete before the kernel enqueued right before this
  // op started (a decode step: the in-projection runs in between). The op then loads its states
  // while that kernel still runs. Leave it false when the preceding kernel writes them.
  bool state_settled = false;
};

// Floats of one proj row the op reads: 3*H*K + 2*gate_rank + H.
std::int64_t kda_proj_width(const KdaParams& p);
// Column offsets inside a proj row.
inline std::int64_t kda_proj_fa_offset(const KdaParams& p) { return 3LL * p.num_heads * p.head_dim; }
inline std::int64_t kda_proj_ga_offset(const KdaParams& p) { return kda_proj_fa_offset(p) + p.gate_rank; }
inline std::int64_t kda_proj_beta_offset(const KdaParams& p) { return kda_proj_ga_offset(p) + p.gate_rank; }
// Floats per slot of each pool.
inline std::int64_t kda_recurrent_state_floats_per_slot(int num_heads, int head_dim) {
  return std::int64_t(num_heads) * head_dim * head_dim;
}
inline std::int64_t kda_conv_state_floats_per_slot(int num_heads, int head_dim) {
  return std::int64_t(kKdaConvHistory) * 3 * num_heads * head_dim;
}

// Tiles of the step: one per (sequence, head), tile = row * num_heads + head.
int kda_num_tiles(const KdaParams& p);
// Dynamic shared memory one tile needs.
std::size_t kda_smem_bytes(const KdaParams& p);

// Validates everything host-visible (dims, pointers, alignment, overlap, host_slot_ids if given),
// returns the failure without launching anything.
Status kda_validate(const KdaParams& p);

// One decode step. `pdl`: launch as a programmatic dependent of the previous kernel.
Status kda(const KdaParams& p, cudaStream_t stream, bool pdl = true);

// The device slot check alone (what kda() enqueues when error_flag is set): ORs KdaError bits for
// slot_ids[0..batch) into *error_flag.
Status kda_check_slots(const int* slot_ids, int batch, int num_slots, int* error_flag, cudaStream_t stream);
// Synchronises `stream`, reads *error_flag and returns kOutOfRange / kInvalidArgument for set bits.
// With `clear`, the flag is zeroed afterwards.
Status kda_read_error(int* error_flag, cudaStream_t stream, bool clear = true);

// ---- state helpers (graph-safe, device slot lists; negative ids are skipped) -------------------
// Zeroes both states of slot_ids[0..count).
Status kda_reset_slots(float* recurrent_state, float* conv_state, int num_slots, int num_heads, int head_dim,
                       const int* slot_ids, int count, cudaStream_t stream);
// Copies one slot's recurrent state from / to the [H][K][V] layout used by HF remote code and fla's
// default kernels (transposing to / from our [H][V][K]). `slot` is a host value.
Status kda_import_state_kv(float* recurrent_state, int num_slots, int num_heads, int head_dim, int slot,
                           const float* state_kv, cudaStream_t stream);
Status kda_export_state_kv(const float* recurrent_state, int num_slots, int num_heads, int head_dim, int slot,
                           float* state_kv, cudaStream_t stream);
// The same in our own [H][V][K] layout (a plain copy of the slot).
Status kda_import_state_vk(float* recurrent_state, int num_slots, int num_heads, int head_dim, int slot,
                           const float* state_vk, cudaStream_t stream);
Status kda_export_state_vk(const float* recurrent_state, int num_slots, int num_heads, int head_dim, int slot,
                           float* state_vk, cudaStream_t stream);

// Layout of one slot's conv history (3 raw inputs per channel, oldest first; channels q|k|v, 3*H*K).
enum class KdaConvLayout {
  kTapMajor,      // [3][3*H*K]: encore's pool layout (vLLM's order; widen its bf16 to fp32 first)
  kChannelMajor,  // [3*H*K][3]: channel-major (fla-style [dim][W] caches: keep the 3 most recent inputs)
};
// Sets / reads one slot's conv history (`slot` is a host value). Together with reset and the
// recurrent-state import, a slot's whole state can be set without a prefill.
Status kda_import_conv_state(float* conv_state, int num_slots, int num_heads, int head_dim, int slot, const float* src,
                             KdaConvLayout layout, cudaStream_t stream);
Status kda_export_conv_state(const float* conv_state, int num_slots, int num_heads, int head_dim, int slot, float* dst,
                             KdaConvLayout layout, cudaStream_t stream);

}  // namespace encore::ops
