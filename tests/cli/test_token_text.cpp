// The encore command's token text: GPT-2 byte-level and SentencePiece tokens read back as bytes
// from a GGUF vocabulary, and bytes shown as one printable line.
#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <encore/gguf.h>

#include "pipeline/cli/token_text.h"

namespace encore::cli {
namespace {

// A GGUF image with no tensors and a vocabulary of `tokens` under tokenizer model `model`.
std::vector<unsigned char> vocabulary_image(const char* model, const std::vector<std::string>& tokens) {
  gguf::Writer w;
  w.bytes().reserve(1024);  // (spares GCC 12 a false -Wstringop-overflow in vector::insert)
  w.put<std::uint32_t>(0x46554747);
  w.put<std::uint32_t>(3);
  w.put<std::uint64_t>(0);  // tensors
  w.put<std::uint64_t>(2);  // keys
  w.text("tokenizer.ggml.model", model);
  w.key("tokenizer.ggml.tokens", gguf::ValueType::kArray);
  w.put<std::uint32_t>(std::uint32_t(gguf::ValueType::kString)), w.put<std::uint64_t>(tokens.size());
  for (const std::string& t : tokens) w.str(t);
  return w.bytes();
}

TEST(TokenText, Gpt2AlphabetMapsBackToEveryByteOnce) {
  std::vector<int> seen(256, 0);
  for (std::uint32_t cp = 0; cp < 0x200; ++cp)
    if (const int b = gpt2_byte(cp); b >= 0) ++seen[b];
  for (int b = 0; b < 256; ++b) EXPECT_EQ(1, seen[b]) << b;
  EXPECT_EQ('A', gpt2_byte('A'));
  EXPECT_EQ(' ', gpt2_byte(0x120));   // "Ġ"
  EXPECT_EQ('\n', gpt2_byte(0x10a));  // "Ċ"
  EXPECT_EQ(-1, gpt2_byte(' '));      // a space is not a character of the alphabet
}

TEST(TokenText, ReadsGpt2AndSentencePieceVocabularies) {
  const auto gpt2 = vocabulary_image("gpt2", {"\xc4\xa0hello", "\xc4\x8a", "caf\xc3\x83\xc2\xa9"});  // "Ġhello", "Ċ", "cafÃ©"
  gguf::File f;
  ASSERT_TRUE(gguf::File::parse(gpt2.data(), gpt2.size(), "gpt2", f).ok());
  const Vocabulary v(f);
  EXPECT_EQ(3u, v.size());
  EXPECT_EQ(" hello", v.piece(0));
  EXPECT_EQ("\n", v.piece(1));
  EXPECT_EQ("caf\xc3\xa9", v.piece(2));  // "café" in UTF-8
  EXPECT_EQ("", v.piece(3));
  EXPECT_EQ("", v.piece(-1));

  const auto spm = vocabulary_image("llama", {"\xe2\x96\x81world", "<0x41>", "<0x0A>"});  // "▁world"
  gguf::File g;
  ASSERT_TRUE(gguf::File::parse(spm.data(), spm.size(), "spm", g).ok());
  const Vocabulary s(g);
  EXPECT_EQ(" world", s.piece(0));
  EXPECT_EQ("A", s.piece(1));
  EXPECT_EQ("\n", s.piece(2));
}

TEST(TokenText, PrintableKeepsTextAndEscapesTheRest) {
  EXPECT_EQ("caf\xc3\xa9 ok", printable("caf\xc3\xa9 ok"));
  EXPECT_EQ("a\\nb\\tc\\\\", printable("a\nb\tc\\"));
  EXPECT_EQ("\\x01\\x7f\\xff\\xc3", printable(std::string("\x01\x7f\xff\xc3", 4)));
}

}  // namespace
}  // namespace encore::cli
