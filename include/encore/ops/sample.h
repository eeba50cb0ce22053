// Greedy decoding on the device: each row's next token is the argmax of its logits (NaN counts as
// -inf; ties go to the lowest id), written into the step inputs with the position and length advanced,
// so that the next decode step replays with no host read in between (docs/generate.md).
//
// A row's token history holds its prompt ahead of time: tokens[b][t] is row b's token at position
// t. While the next position is still inside the prompt (below prompt_lens[b]), the prompt's token
// is fed instead of the argmax, so prompt and generation run through the same replayed step.
//
// For a live row b (slot_ids[b] >= 0, seq_lens[b] > 0) at position t = positions[b]:
//   next = t + 1 < prompt_lens[b] ? tokens[b][t + 1] : argmax(logits[b][0 .. vocab))
//   tokens[b][t + 1] = next; token_ids[b] = next; positions[b] = t + 1; seq_lens[b] = t + 2
// unless position t + 1 has no room (t + 1 >= capacity, or the block-table entry of its cache page
// is outside [0, max_pages)): then the row becomes a pad row (slot -1, length 0; its position still
// names its last token), its history is not written, and kSampleRowOutOfRoom is ORed into *flags.
// Pad rows are left as they are. So after any number of steps, row b's tokens are
// tokens[b][0 .. positions[b]].
//
// Two kernels: per-chunk partial argmaxes over [batch][chunks] tiles, then one tile per row that
// reduces them and advances the row. Deterministic: a fixed reduction order, and the only atomic is
// the integer flag's OR.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include <encore/status.h>

namespace encore::ops {

inline constexpr int kSampleMaxBatch = 256;
inline constexpr int kSampleChunk = 4096;  // logits per partial-argmax tile

enum SampleError : int {
  kSampleRowOutOfRoom = 1,  // a row reached the end of its history or of its cache pages and stopped
};

struct GreedyParams {
  const float* logits = nullptr;     // [batch][logits_stride], the step's output
  std::int64_t logits_stride = 0;    // floats between rows, >= vocab
  int vocab = 0, batch = 0;

  // The step inputs (device, updated in place), as Pipeline's buffer arena holds them.
  std::int32_t* token_ids = nullptr;    // [batch]
  std::int32_t* positions = nullptr;    // [batch]
  std::int32_t* seq_lens = nullptr;     // [batch]
  std::int32_t* slot_ids = nullptr;     // [batch]
  const std::int32_t* block_table = nullptr;  // [batch][max_pages_per_seq]
  int max_pages_per_seq = 0, max_pages = 0, page_size = 64;

  // Per-row token history and prompt lengths (device).
  std::int32_t* tokens = nullptr;             // [batch][capacity]
  const std::int32_t* prompt_lens = nullptr;  // [batch]
  int capacity = 0;                           // <= max_pages_per_seq * page_size

  void* workspace = nullptr;       // greedy_workspace_bytes(batch, vocab), 16-byte aligned
  std::int32_t* flags = nullptr;   // sticky SampleError bits (the caller clears them)
};

// Partial-argmax tiles of one row.
constexpr int greedy_chunks(int vocab) { return (vocab + kSampleChunk - 1) / kSampleChunk; }
std::size_t greedy_workspace_bytes(int batch, int vocab);

// Host-side checks: dims, pointers, alignment, and that no output overlaps another buffer.
Status validate(const GreedyParams& p);

// Validate, then enqueue both kernels (programmatic dependents of the previous kernel). Capturable.
Status greedy_next(const GreedyParams& p, cudaStream_t stream);

}  // namespace encore::ops
