// Quantises a row with the installed library, decodes it, and validates a GEMV call's arguments.
#include <encore/encore.h>  // every public header must compile in a plain C++ project

#include <cmath>
#include <cstdio>
#include <vector>

int main() {
  std::vector<float> x(256), y(256);
  for (int i = 0; i < 256; ++i) x[i] = std::sin(0.1f * i);
  encore::q4k::Block block;
  if (!encore::q4k::quantize_row(x.data(), &block, 256).ok() || !encore::q4k::dequantize_row(&block, y.data(), 256).ok())
    return 1;
  double err = 0, ref = 0;
  for (int i = 0; i < 256; ++i) err += (x[i] - y[i]) * (x[i] - y[i]), ref += x[i] * x[i];
  encore::ops::Q4kGemvParams p;  // k = 0: rejected before any CUDA call
  const encore::Status s = encore::ops::q4k_gemv(p, nullptr);
  std::printf("round-trip rel error %.4f; empty GEMV call: %s\n", std::sqrt(err / ref), s.to_string().c_str());
  return std::sqrt(err / ref) < 0.1 && s.code() == encore::StatusCode::kInvalidArgument ? 0 : 1;
}
