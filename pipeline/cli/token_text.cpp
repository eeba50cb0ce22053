// Token pieces as text (token_text.h).
#include "token_text.h"

#include <cstdio>

namespace encore::cli {
namespace {

// GPT-2 keeps these bytes as the characters of the same code; the others (controls, space, DEL,
// NBSP, soft hyphen) become U+0100 + their rank among them.
bool kept_as_is(int b) { return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255); }

// Decodes one UTF-8 sequence at s[i] (advancing i); -1 for a malformed one (one byte consumed).
long next_codepoint(std::string_view s, std::size_t& i) {
  const unsigned char c = static_cast<unsigned char>(s[i]);
  const int extra = c < 0x80 ? 0 : (c >> 5) == 6 ? 1 : (c >> 4) == 14 ? 2 : (c >> 3) == 30 ? 3 : -1;
  if (extra < 0 || s.size() - i <= std::size_t(extra)) return ++i, -1;
  long cp = extra == 0 ? c : (c & (0x3f >> extra));
  for (int k = 1; k <= extra; ++k) {
    const unsigned char d = static_cast<unsigned char>(s[i + k]);
    if ((d >> 6) != 2) return ++i, -1;
    cp = (cp << 6) | (d & 0x3f);
  }
  i += std::size_t(extra) + 1;
  return cp;
}

void append_utf8(std::string& out, long cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xc0 | (cp >> 6)), out += char(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += char(0xe0 | (cp >> 12)), out += char(0x80 | ((cp >> 6) & 0x3f)), out += char(0x80 | (cp & 0x3f));
  } else {
    out += char(0xf0 | (cp >> 18)), out += char(0x80 | ((cp >> 12) & 0x3f)), out += char(0x80 | ((cp >> 6) & 0x3f));
    out += char(0x80 | (cp & 0x3f));
  }
}

std::string from_gpt2(std::string_view token) {
  std::string out;
  for (std::size_t i = 0; i < token.size();) {
    const long cp = next_codepoint(token, i);
    const int b = cp < 0 ? -1 : gpt2_byte(std::uint32_t(cp));
    if (b >= 0) out += char(b);
    else if (cp >= 0) append_utf8(out, cp);  // not in the alphabet: kept as written
  }
  return out;
}

std::string from_sentencepiece(std::string_view token) {
  unsigned byte = 0;
  if (token.size() == 6 && token.substr(0, 3) == "<0x" && token[5] == '>' &&
      std::sscanf(std::string(token.substr(3, 2)).c_str(), "%2x", &byte) == 1)
    return std::string(1, char(byte));
  std::string out;
  for (std::size_t i = 0; i < token.size();) {
    const std::size_t at = i;
    const long cp = next_codepoint(token, i);
    if (cp == 0x2581) out += ' ';
    else out.append(token.substr(at, i - at));
  }
  return out;
}

}  // namespace

int gpt2_byte(std::uint32_t codepoint) {
  if (codepoint < 256) return kept_as_is(int(codepoint)) ? int(codepoint) : -1;
  int rank = int(codepoint) - 256;
  for (int b = 0; b < 256; ++b)
    if (!kept_as_is(b) && rank-- == 0) return b;
  return -1;
}

Vocabulary::Vocabulary(const gguf::File& file) : file_(&file) {
  if (const gguf::KeyValue* kv = file.find("tokenizer.ggml.tokens");
      kv && kv->value.type == gguf::ValueType::kArray && kv->value.element == gguf::ValueType::kString)
    tokens_ = &kv->value;
  if (!file.get("tokenizer.ggml.model", &model_).ok()) model_.clear();
}

std::string Vocabulary::piece(std::int32_t id) const {
  gguf::Value v;
  if (!tokens_ || id < 0 || std::uint64_t(id) >= tokens_->count || !file_->array_element(*tokens_, std::uint64_t(id), &v).ok())
    return {};
  if (model_ == "gpt2") return from_gpt2(v.str);
  if (model_ == "llama") return from_sentencepiece(v.str);
  return std::string(v.str);
}

std::string printable(std::string_view bytes) {
  std::string out;
  for (std::size_t i = 0; i < bytes.size();) {
    const std::size_t at = i;
    const long cp = next_codepoint(bytes, i);
    if (cp == '\n') out += "\\n";
    else if (cp == '\t') out += "\\t";
    else if (cp == '\\') out += "\\\\";
    else if (cp >= 0x20 && cp != 0x7f) out.append(bytes.substr(at, i - at));
    else {
      char buf[8];
      for (std::size_t k = at; k < i; ++k) {
        std::snprintf(buf, sizeof(buf), "\\x%02x", static_cast<unsigned char>(bytes[k]));
        out += buf;
      }
    }
  }
  return out;
}

}  // namespace encore::cli
