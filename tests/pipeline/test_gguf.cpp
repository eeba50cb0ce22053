// The GGUF reader (CPU): a small valid file written here, every value type read back, corruptions
// that must be named, thousands of mutated copies that must each end in a clean error or a clean
// load, and (when gguf-py is installed) a file written by gguf-py's own writer.
#include <encore/gguf.h>
#include <encore/q4k.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "test_util.h"

namespace encore::gguf {
namespace {

struct Image {
  std::vector<unsigned char> bytes;
  std::size_t tensor_count_at, kv_count_at, first_offset_at, first_type_at, first_dim_at, data_start;
};

// Three tensors (F32 [8 x 2], Q4_K [256 x 3], F16 [16]) and one key of every value type.
Image valid_image() {
  gguf::Writer w;
  Image img{};
  w.put<std::uint32_t>(0x46554747);
  w.put<std::uint32_t>(3);
  img.tensor_count_at = w.bytes().size();
  w.put<std::uint64_t>(3);
  img.kv_count_at = w.bytes().size();
  w.put<std::uint64_t>(15);
  w.key("general.architecture", ValueType::kString), w.str("kimi-linear");
  w.key("general.alignment", ValueType::kU32), w.put<std::uint32_t>(32);
  w.key("t.u8", ValueType::kU8), w.put<std::uint8_t>(200);
  w.key("t.i8", ValueType::kI8), w.put<std::int8_t>(-5);
  w.key("t.u16", ValueType::kU16), w.put<std::uint16_t>(60000);
  w.key("t.i16", ValueType::kI16), w.put<std::int16_t>(-30000);
  w.key("t.u32", ValueType::kU32), w.put<std::uint32_t>(4000000000u);
  w.key("t.i32", ValueType::kI32), w.put<std::int32_t>(-2000000000);
  w.key("t.f32", ValueType::kF32), w.put<float>(1e-5f);
  w.key("t.bool", ValueType::kBool), w.put<std::uint8_t>(1);
  w.key("t.u64", ValueType::kU64), w.put<std::uint64_t>(1ull << 40);
  w.key("t.i64", ValueType::kI64), w.put<std::int64_t>(-(1ll << 40));
  w.key("t.f64", ValueType::kF64), w.put<double>(0.125);
  w.key("t.layers", ValueType::kArray), w.put<std::uint32_t>(std::uint32_t(ValueType::kI32)), w.put<std::uint64_t>(3);
  for (int v : {1, 4, 27}) w.put<std::int32_t>(v);
  w.key("t.tokens", ValueType::kArray), w.put<std::uint32_t>(std::uint32_t(ValueType::kString)), w.put<std::uint64_t>(2);
  w.str("hello"), w.str("");
  struct T {
    const char* name;
    std::vector<std::uint64_t> dims;
    TensorType type;
    std::uint64_t bytes;
  };
  const T tensors[] = {{"blk.0.norm.weight", {8, 2}, TensorType::kF32, 64},
                       {"blk.0.attn_q.weight", {256, 3}, TensorType::kQ4_K, 3 * 144},
                       {"blk.1.norm.weight", {16}, TensorType::kF16, 32}};
  std::uint64_t offset = 0;
  for (const T& t : tensors) {
    w.str(t.name);
    w.put<std::uint32_t>(std::uint32_t(t.dims.size()));
    if (t.name == tensors[0].name) img.first_dim_at = w.bytes().size();
    for (std::uint64_t d : t.dims) w.put<std::uint64_t>(d);
    if (t.name == tensors[0].name) img.first_type_at = w.bytes().size();
    w.put<std::uint32_t>(std::uint32_t(t.type));
    if (t.name == tensors[0].name) img.first_offset_at = w.bytes().size();
    w.put<std::uint64_t>(offset);
    offset = (offset + t.bytes + 31) / 32 * 32;
  }
  w.pad_to(32);
  img.data_start = w.bytes().size();
  for (std::uint64_t i = 0; i < offset; ++i) w.bytes().push_back(static_cast<unsigned char>(i * 7));
  img.bytes = std::move(w.bytes());
  return img;
}

template <class T>
void poke(std::vector<unsigned char>& b, std::size_t at, T v) {
  std::memcpy(b.data() + at, &v, sizeof(T));
}

// Where `text` (a key or a tensor name) first stands in the image, and what follows it 4 bytes
// later: a key's value (after its u32 type word), a tensor's first dimension (after its count).
std::size_t find(const std::vector<unsigned char>& b, const std::string& text) {
  return std::size_t(std::search(b.begin(), b.end(), text.begin(), text.end()) - b.begin());
}
std::size_t value_of(const std::vector<unsigned char>& b, const std::string& key) { return find(b, key) + key.size() + 4; }

Status parse(const std::vector<unsigned char>& b, File& f) { return File::parse(b.data(), b.size(), "test.gguf", f); }

TEST(Gguf, ReadsEveryValueTypeAndTensor) {
  const Image img = valid_image();
  File f;
  ENCORE_OK(parse(img.bytes, f));
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.metadata().size(), 15u);
  std::string arch;
  ENCORE_OK(f.get("general.architecture", &arch));
  EXPECT_EQ(arch, "kimi-linear");
  std::uint64_t u = 0;
  std::int64_t i = 0;
  double d = 0;
  bool flag = false;
  ENCORE_OK(f.get("t.u8", &u));
  EXPECT_EQ(u, 200u);
  ENCORE_OK(f.get("t.u16", &u));
  EXPECT_EQ(u, 60000u);
  ENCORE_OK(f.get("t.u32", &u));
  EXPECT_EQ(u, 4000000000u);
  ENCORE_OK(f.get("t.u64", &u));
  EXPECT_EQ(u, 1ull << 40);
  ENCORE_OK(f.get("t.i8", &i));
  EXPECT_EQ(i, -5);
  ENCORE_OK(f.get("t.i16", &i));
  EXPECT_EQ(i, -30000);
  ENCORE_OK(f.get("t.i32", &i));
  EXPECT_EQ(i, -2000000000);
  ENCORE_OK(f.get("t.i64", &i));
  EXPECT_EQ(i, -(1ll << 40));
  ENCORE_OK(f.get("t.u32", &i));
  EXPECT_EQ(i, 4000000000ll);  // widened
  ENCORE_OK(f.get("t.f32", &d));
  EXPECT_EQ(d, double(1e-5f));
  ENCORE_OK(f.get("t.f64", &d));
  EXPECT_EQ(d, 0.125);
  ENCORE_OK(f.get("t.bool", &flag));
  EXPECT_TRUE(flag);
  EXPECT_EQ(f.get("t.i8", &u).code(), StatusCode::kInvalidFile);  // negative: not a u64
  EXPECT_EQ(f.get("t.f32", &i).code(), StatusCode::kInvalidFile);
  const Status missing = f.get("kimi-linear.block_count", &u);
  EXPECT_EQ(missing.code(), StatusCode::kInvalidFile);
  EXPECT_NE(missing.message().find("test.gguf: key kimi-linear.block_count is missing"), std::string::npos) << missing.message();

  const KeyValue* layers = f.find("t.layers");
  ASSERT_NE(layers, nullptr);
  ASSERT_EQ(layers->value.count, 3u);
  Value v;
  ENCORE_OK(f.array_element(layers->value, 2, &v));
  EXPECT_EQ(v.i, 27);
  EXPECT_EQ(f.array_element(layers->value, 3, &v).code(), StatusCode::kOutOfRange);
  const KeyValue* tokens = f.find("t.tokens");
  ASSERT_NE(tokens, nullptr);
  ENCORE_OK(f.array_element(tokens->value, 0, &v));
  EXPECT_EQ(v.str, "hello");
  ENCORE_OK(f.array_element(tokens->value, 1, &v));
  EXPECT_EQ(v.str, "");

  ASSERT_EQ(f.tensors().size(), 3u);
  const TensorInfo* q = f.tensor("blk.0.attn_q.weight");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->type, TensorType::kQ4_K);
  EXPECT_EQ(q->dims, (std::vector<std::int64_t>{256, 3}));
  EXPECT_EQ(q->bytes, 3u * 144);
  EXPECT_EQ(q->offset, 64u);
  EXPECT_EQ(static_cast<const unsigned char*>(q->data), img.bytes.data() + img.data_start + 64);
  EXPECT_EQ(f.tensor("blk.1.norm.weight")->elements(), 16);
}

// Each corruption is refused with kInvalidFile and a message that names what is wrong.
TEST(Gguf, CorruptionsAreNamed) {
  const Image good = valid_image();
  auto expect = [&](const char* what, std::vector<unsigned char> b, const char* needle) {
    File f;
    const Status s = parse(b, f);
    EXPECT_EQ(s.code(), StatusCode::kInvalidFile) << what << ": " << s.to_string();
    EXPECT_NE(s.message().find(needle), std::string::npos) << what << ": " << s.message();
    EXPECT_TRUE(s.message().rfind("test.gguf: ", 0) == 0) << what << ": " << s.message();
    EXPECT_TRUE(f.tensors().empty() && f.metadata().empty()) << what;
  };
  auto with = [&](auto edit) {
    std::vector<unsigned char> b = good.bytes;
    edit(b);
    return b;
  };
  expect("magic", with([](auto& b) { b[0] = 'X'; }), "not a GGUF file");
  expect("version", with([](auto& b) { poke<std::uint32_t>(b, 4, 1); }), "GGUF version 1");
  expect("empty", {}, "truncated");
  expect("tensor count", with([&](auto& b) { poke<std::uint64_t>(b, good.tensor_count_at, 1ull << 60); }), "tensors in");
  expect("kv count", with([&](auto& b) { poke<std::uint64_t>(b, good.kv_count_at, 1ull << 50); }), "metadata entries");
  expect("truncated data", std::vector<unsigned char>(good.bytes.begin(), good.bytes.end() - 1), "runs past the end");
  expect("truncated header", std::vector<unsigned char>(good.bytes.begin(), good.bytes.begin() + 40), "claims 15 metadata entries");
  expect("truncated key", std::vector<unsigned char>(good.bytes.begin(), good.bytes.begin() + 300), "truncated");
  expect("unknown type", with([&](auto& b) { poke<std::uint32_t>(b, good.first_type_at, 77); }), "unknown type 77");
  expect("misaligned", with([&](auto& b) { poke<std::uint64_t>(b, good.first_offset_at, 8); }), "not aligned");
  expect("overlap", with([&](auto& b) { poke<std::uint64_t>(b, good.first_offset_at, 64); }), "overlap");
  expect("past the end", with([&](auto& b) { poke<std::uint64_t>(b, good.first_offset_at, 1ull << 40); }), "runs past the end");
  expect("zero dim", with([&](auto& b) { poke<std::uint64_t>(b, good.first_dim_at, 0); }), "dimension 0 = 0");
  expect("huge dim", with([&](auto& b) { poke<std::uint64_t>(b, good.first_dim_at, ~0ull); }), "dimension 0");
  // A Q4_K row that is not whole blocks: the attn_q tensor's first dim follows its name.
  expect("partial block", with([&](auto& b) {
           poke<std::uint64_t>(b, value_of(b, "blk.0.attn_q.weight"), 255);  // (after the dimension count)
         }),
         "not whole Q4_K blocks");
  expect("duplicate tensor", with([&](auto& b) {
           b[find(b, "blk.1.norm.weight") + 4] = '0';  // now blk.0.norm.weight, the first tensor's name
         }),
         "tensor blk.0.norm.weight appears twice");
  expect("duplicate key", with([&](auto& b) {
           std::memcpy(b.data() + find(b, "t.i16"), "t.u16", 5);
         }),
         "key t.u16 appears twice");
  expect("bad alignment", with([&](auto& b) {
           poke<std::uint32_t>(b, value_of(b, "general.alignment"), 24);
         }),
         "general.alignment = 24");
  expect("bool", with([&](auto& b) {
           b[value_of(b, "t.bool")] = 2;
         }),
         "bool of value 2");
}

// Random mutations of a valid image: byte flips, truncations, and edits of counts, lengths and
// offsets. Every case must end in ok or kInvalidFile (never a crash, a hang or another code),
// and a loaded file's tensors must lie inside the image.
TEST(Gguf, MutatedFilesFailCleanly) {
  const Image good = valid_image();
  std::mt19937_64 rng(test::fresh_seed());
  int loaded = 0, refused = 0;
  const std::size_t n = good.bytes.size();
  for (int c = 0; c < 4000; ++c) {
    std::vector<unsigned char> b = good.bytes;
    switch (c % 4) {
      case 0:  // one to eight random byte flips
        for (int k = 1 + int(rng() % 8); k > 0; --k) b[rng() % n] ^= static_cast<unsigned char>(1 + rng() % 255);
        break;
      case 1:  // truncation anywhere
        b.resize(rng() % n);
        break;
      case 2: {  // a 64-bit field somewhere in the header set to an extreme or random value
        const std::uint64_t values[] = {0, 1, ~0ull, 1ull << 63, 1ull << 32, rng(), rng() % 1024};
        const std::size_t at = rng() % (good.data_start - 8);
        poke<std::uint64_t>(b, at, values[rng() % std::size(values)]);
        break;
      }
      default: {  // a 32-bit field (types, counts of dims) set to a small or extreme value
        const std::uint32_t values[] = {0, 1, 4, 5, 9, 13, 31, ~0u, std::uint32_t(rng())};
        const std::size_t at = rng() % (good.data_start - 4);
        poke<std::uint32_t>(b, at, values[rng() % std::size(values)]);
      }
    }
    File f;
    const Status s = parse(b, f);
    if (s.ok()) {
      ++loaded;
      for (const TensorInfo& t : f.tensors()) {
        const auto* p = static_cast<const unsigned char*>(t.data);
        ASSERT_TRUE(p >= b.data() && p + t.bytes <= b.data() + b.size()) << "case " << c << ": " << t.name;
      }
    } else {
      ++refused;
      ASSERT_EQ(s.code(), StatusCode::kInvalidFile) << "case " << c << ": " << s.to_string();
      ASSERT_FALSE(s.message().empty());
    }
  }
  EXPECT_GT(refused, 1000);
  EXPECT_GT(loaded, 0);  // flips inside tensor data or string bytes leave a valid file
}

TEST(Gguf, OpensFilesAndRefusesMissingOnes) {
  const Image img = valid_image();
  const std::string path = ::testing::TempDir() + "encore_gguf_test.gguf";
  {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(img.bytes.data()), std::streamsize(img.bytes.size()));
  }
  File f;
  ENCORE_OK(File::open(path, f));
  EXPECT_EQ(f.tensors().size(), 3u);
  File moved = std::move(f);
  EXPECT_EQ(moved.tensor("blk.0.norm.weight")->bytes, 64u);
  std::remove(path.c_str());
  const Status s = File::open(path, f);
  EXPECT_EQ(s.code(), StatusCode::kInvalidFile);
  EXPECT_NE(s.message().find("cannot open"), std::string::npos) << s.message();
}

// gguf-py (PyPI, llama.cpp's own Python package) writes a file; the reader agrees with it.
TEST(Gguf, ReadsWhatGgufPyWrites) {
  if (std::system("python3 -c 'import gguf, numpy' >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "gguf-py not importable (pip install gguf); cross-check skipped";
  const std::string path = ::testing::TempDir() + "encore_gguf_py.gguf";
  const std::string cmd =
      "python3 -c \"import numpy as np, gguf\n"
      "w = gguf.GGUFWriter('" + path + "', 'kimi-linear')\n"
      "w.add_block_count(27)\n"
      "w.add_float32('kimi-linear.attention.layer_norm_rms_epsilon', 1e-5)\n"
      "w.add_array('t.ints', [3, 1, 4])\n"
      "w.add_tensor('token_embd.weight', np.arange(32 * 4, dtype=np.float32).reshape(4, 32))\n"
      "w.add_tensor('output_norm.weight', np.ones(64, dtype=np.float16))\n"
      "w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()\"";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  File f;
  ENCORE_OK(File::open(path, f));
  std::string arch;
  ENCORE_OK(f.get("general.architecture", &arch));
  EXPECT_EQ(arch, "kimi-linear");
  std::uint64_t blocks = 0;
  ENCORE_OK(f.get("kimi-linear.block_count", &blocks));
  EXPECT_EQ(blocks, 27u);
  double eps = 0;
  ENCORE_OK(f.get("kimi-linear.attention.layer_norm_rms_epsilon", &eps));
  EXPECT_EQ(eps, double(1e-5f));
  const KeyValue* ints = f.find("t.ints");
  ASSERT_NE(ints, nullptr);
  EXPECT_EQ(ints->value.count, 3u);
  const TensorInfo* e = f.tensor("token_embd.weight");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->type, TensorType::kF32);
  EXPECT_EQ(e->dims, (std::vector<std::int64_t>{32, 4}));  // ggml order: the row length first
  EXPECT_EQ(static_cast<const float*>(e->data)[33], 33.f);
  const TensorInfo* n = f.tensor("output_norm.weight");
  ASSERT_NE(n, nullptr);
  EXPECT_EQ(n->type, TensorType::kF16);
  EXPECT_EQ(n->bytes, 128u);
  std::remove(path.c_str());
}

// Every decoder against gguf-py's (llama.cpp's numpy decoders), bit for bit, on random blocks with
// finite scales; and a hand-made Q5_0 block without it.
TEST(Gguf, DecodesLikeGgufPy) {
  {
    unsigned char block[22] = {};
    const std::uint16_t d = q4k::float_to_half(0.5f);
    std::memcpy(block, &d, 2);
    const std::uint32_t qh = 1u << 3;  // value 3 gets its fifth bit
    std::memcpy(block + 2, &qh, 4);
    block[6 + 3] = 0x72;  // value 3: code 2 (+16), value 19: code 7
    float out[32];
    ENCORE_OK(decode(TensorType::kQ5_0, block, 32, out));
    EXPECT_EQ(out[3], 1.f);       // (18 - 16) * 0.5
    EXPECT_EQ(out[19], -4.5f);    // (7 - 16) * 0.5
    EXPECT_EQ(out[0], -8.f);      // (0 - 16) * 0.5
    EXPECT_EQ(decode(TensorType::kQ6_K, block, 256, out).code(), StatusCode::kUnsupported);
    EXPECT_EQ(decode(TensorType::kQ5_0, block, 31, out).code(), StatusCode::kInvalidArgument);
  }
  if (std::system("python3 -c 'import gguf.quants, numpy' >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "gguf-py not importable (pip install gguf); cross-check skipped";
  std::mt19937_64 rng(test::fresh_seed());
  std::uniform_real_distribution<float> scale(-0.05f, 0.05f), value(-4.f, 4.f);
  struct Case {
    TensorType type;
    const char* name;
    std::vector<int> half_at;  // byte offsets of the block's fp16 fields
  };
  const Case cases[] = {{TensorType::kF16, "F16", {}},      {TensorType::kBF16, "BF16", {}},   {TensorType::kQ8_0, "Q8_0", {0}},
                        {TensorType::kQ4_0, "Q4_0", {0}},   {TensorType::kQ4_1, "Q4_1", {0, 2}}, {TensorType::kQ5_0, "Q5_0", {0}},
                        {TensorType::kQ5_1, "Q5_1", {0, 2}}, {TensorType::kQ4_K, "Q4_K", {0, 2}}};
  for (const Case& c : cases) {
    std::int64_t block_values = 0, block_bytes = 0;
    ASSERT_TRUE(block_shape(std::uint32_t(c.type), &block_values, &block_bytes));
    const std::int64_t values = 4096, blocks = values / block_values;
    std::vector<unsigned char> raw(std::size_t(blocks * block_bytes));
    for (auto& b : raw) b = static_cast<unsigned char>(rng());
    for (std::int64_t i = 0; i < (c.type == TensorType::kF16 || c.type == TensorType::kBF16 ? values : 0); ++i) {
      const float v = value(rng);
      std::uint32_t bits;
      std::memcpy(&bits, &v, 4);
      const std::uint16_t h = c.type == TensorType::kF16 ? q4k::float_to_half(v) : std::uint16_t(bits >> 16);
      std::memcpy(raw.data() + 2 * i, &h, 2);
    }
    for (std::int64_t b = 0; b < blocks; ++b)
      for (int at : c.half_at) {
        const std::uint16_t h = q4k::float_to_half(scale(rng));
        std::memcpy(raw.data() + b * block_bytes + at, &h, 2);
      }
    std::vector<float> ours(static_cast<std::size_t>(values)), theirs(static_cast<std::size_t>(values));
    ENCORE_OK(decode(c.type, raw.data(), values, ours.data()));
    const std::string in = ::testing::TempDir() + "encore_decode_in.bin", out = ::testing::TempDir() + "encore_decode_out.bin";
    {
      std::ofstream f(in, std::ios::binary);
      f.write(reinterpret_cast<const char*>(raw.data()), std::streamsize(raw.size()));
    }
    const std::string cmd = "python3 -c \"import numpy as np, gguf; from gguf.quants import dequantize; "
                            "r = np.fromfile('" + in + "', dtype=np.uint8); "
                            "dequantize(r, gguf.GGMLQuantizationType." + c.name + ").astype(np.float32).tofile('" + out + "')\"";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    std::ifstream f(out, std::ios::binary);
    f.read(reinterpret_cast<char*>(theirs.data()), std::streamsize(values * 4));
    ASSERT_TRUE(f.good()) << c.name;
    for (std::int64_t i = 0; i < values; ++i)
      ASSERT_EQ(std::memcmp(&ours[i], &theirs[i], 4), 0) << c.name << " value " << i << ": ours " << ours[i] << ", gguf-py " << theirs[i];
    std::remove(in.c_str());
    std::remove(out.c_str());
  }
}

}  // namespace
}  // namespace encore::gguf
