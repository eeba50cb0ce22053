// Writes GGUF v3 images field by field, for the reader's and the model mapping's tests.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <encore/gguf.h>

namespace encore::test {

class GgufWriter {
 public:
  template <class T>
  void put(T v) {
    const auto* p = reinterpret_cast<const unsigned char*>(&v);
    bytes.insert(bytes.end(), p, p + sizeof(T));
  }
  void str(const std::string& s) {
    put<std::uint64_t>(s.size());
    bytes.insert(bytes.end(), s.begin(), s.end());
  }
  void key(const std::string& k, gguf::ValueType t) {
    str(k);
    put<std::uint32_t>(std::uint32_t(t));
  }
  void align(std::size_t a) {
    while (bytes.size() % a) bytes.push_back(0);
  }
  std::vector<unsigned char> bytes;
};

}  // namespace encore::test
