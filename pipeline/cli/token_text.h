// The text of a GGUF vocabulary's tokens (tokenizer.ggml.tokens), for the encore command's output.
// llama.cpp stores byte-level BPE tokens ("gpt2") in GPT-2's byte-to-character mapping and
// SentencePiece tokens ("llama") with U+2581 for spaces and <0xNN> byte tokens; both are turned
// back into bytes. Other tokenizers' tokens are shown as stored.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <encore/gguf.h>

namespace encore::cli {

class Vocabulary {
 public:
  // Reads the token list of `file` (empty when the file has none); `file` must outlive this.
  explicit Vocabulary(const gguf::File& file);
  std::uint64_t size() const { return tokens_ ? tokens_->count : 0; }
  const std::string& model() const { return model_; }
  // The bytes token `id` stands for ("" for an id outside the list).
  std::string piece(std::int32_t id) const;

 private:
  const gguf::File* file_;
  const gguf::Value* tokens_ = nullptr;
  std::string model_;
};

// Bytes as one line of text: printable ASCII and valid UTF-8 kept, anything else as \xNN,
// newline and tab as \n and \t.
std::string printable(std::string_view bytes);

// GPT-2's byte-level BPE alphabet read back: the byte one character of a token stands for, or -1.
int gpt2_byte(std::uint32_t codepoint);

}  // namespace encore::cli
