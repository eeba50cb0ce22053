// A kimi-linear GGUF file (as llama.cpp's converter and llama-quantize write it) seen as an encore
// model (docs/gguf.md §3-§4): the ModelConfig its metadata describes, and for every tensor of
// encore's weight layout the file tensor(s) it comes from and the conversion it needs. A model or
// a tensor encore cannot run is refused with the key or tensor, its value or type, and what would
// work instead. Everything but the upload runs on the host alone.
#pragma once

#include <string>

#include <cuda_runtime.h>
#include <vector>

#include <encore/gguf.h>
#include <encore/pipeline/model_config.h>
#include <encore/pipeline/tensor_arena.h>
#include <encore/status.h>

namespace encore::pipeline {

// What a refused projection's message advises (in parentheses after the tensor and its type).
inline constexpr const char* kQ4kFileAdvice = "a file whose projections are all Q4_K works: llama-quantize --pure IN OUT Q4_K";

// Reads and checks every key the model needs (general.architecture must be "kimi-linear").
Status model_config_from_gguf(const gguf::File& file, ModelConfig* out);

enum class TensorConversion {
  kCopy,         // same bytes (Q4_K blocks, F32 values): the file's data as is
  kToF32,        // decoded from F32 / F16 / BF16 / Q8_0 / Q5_0 / Q5_1 / Q4_0 / Q4_K to fp32
  kToBf16,       // the same, rounded to bf16
  kLogNegA,      // ssm_a holds -exp(A_log): encore keeps A_log = log(-a)
  kKvBFromKAndV, // attn_k_b (W_UK, transposed per head) and attn_v_b (W_UV) into [head][nope + v][latent] bf16
  kRowSlice,     // rows [first_row, first_row + rows of the tensor) of a fused file tensor (attn_qkv)
};
const char* to_string(TensorConversion c);

struct TensorSource {
  std::string name;                            // encore's tensor (weight_layout.h)
  std::vector<const gguf::TensorInfo*> from;   // the file's tensor(s)
  TensorConversion conversion = TensorConversion::kCopy;
  std::int64_t first_row = 0;                  // kRowSlice
};

// The source of every tensor of `weights` (build_weight_layout(config)); kInvalidFile for a
// missing tensor or a wrong shape, kUnsupported for a type encore does not run (naming the tensor,
// its type, and `llama-quantize --pure IN OUT Q4_K` as the file that works). On error `out` is left
// as it was; with `refusals`, every tensor is still planned and each refusal is appended (the first
// is also the result), e.g. to list every Q6_K projection of a Q4_K_M file.
Status plan_gguf_weights(const gguf::File& file, const ModelConfig& config, const TensorArena& weights,
                         std::vector<TensorSource>* out, std::vector<Status>* refusals = nullptr);

// One weight in encore's format (w.bytes bytes at `out`, host memory) from its source.
Status convert_weight(const TensorSource& source, const TensorInfo& w, void* out);

// Every weight of the plan into the arena at `device_base` (a Pipeline's weights()), through
// pinned staging buffers in chunks, converting on the host while the previous chunk uploads. With
// `progress` a line on stderr tracks GB done, GB/s and the time left, and ends with the total time.
// Synchronises `stream`.
Status load_gguf_weights(const std::vector<TensorSource>& plan, const TensorArena& weights, void* device_base, cudaStream_t stream,
                         bool progress = true);

// Writes a model as a kimi-linear GGUF v3 file in llama.cpp's conventions (the inverse of the plan:
// ssm_a = -exp(A_log), attn_kv_b split into attn_k_b / attn_v_b in bf16, the router in F32, the
// rest as stored), so that llama.cpp can run the same weights. `host_weights` holds the whole weight
// arena (weights.total_bytes()) in host memory. The config must be one a kimi-linear file can say:
// equal KDA and MLA head counts, MLA without RoPE or q LoRA, no group stage, at most one shared
// expert. Shapes as llama.cpp checks them (conv taps [taps, 1, channels], ssm_a [1, heads]).
Status save_gguf(const std::string& path, const ModelConfig& config, const TensorArena& weights, const void* host_weights);

}  // namespace encore::pipeline
