// Host side of the Q4_K format: scale packing, fp16 conversion, decode, and the reference
// quantiser. Compiled with -ffp-contract=off: the quantiser must not fuse multiply-adds to stay
// byte-exact with ggml (docs/q4k.md §6).
#include <encore/q4k.h>

#include <algorithm>
#include <cmath>
#include <cstring>

namespace encore::q4k {

namespace {
Status check_row(const char* op, const void* in, const void* out, std::int64_t n) {
  ENCORE_REQUIRE(n >= 0 && n % kBlockValues == 0, StatusCode::kInvalidArgument, op,
                 ": n must be a non-negative multiple of 256 (got ", n, ")");
  ENCORE_REQUIRE(n == 0 || (in != nullptr && out != nullptr), StatusCode::kNullPointer, op, ": in or out is null");
  return {};
}
}  // namespace

void unpack_scales(const Block& b, std::uint8_t sc[8], std::uint8_t m[8]) {
  const std::uint8_t* s = b.scales;
  for (int j = 0; j < 4; ++j) {
    sc[j] = s[j] & 63;
    m[j] = s[j + 4] & 63;
  }
  for (int j = 4; j < 8; ++j) {
    sc[j] = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
    m[j] = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

void pack_scales(const std::uint8_t sc[8], const std::uint8_t m[8], Block& b) {
  std::uint8_t* s = b.scales;
  for (int j = 0; j < 4; ++j) {
    s[j] = sc[j] & 63;
    s[j + 4] = m[j] & 63;
  }
  for (int j = 4; j < 8; ++j) {
    s[j + 4] = (sc[j] & 0x0F) | ((m[j] & 0x0F) << 4);
    s[j - 4] |= (sc[j] >> 4) << 6;
    s[j] |= (m[j] >> 4) << 6;
  }
}

float half_to_float(std::uint16_t h) {
  std::uint32_t sign = std::uint32_t(h & 0x8000) << 16;
  std::uint32_t exp = (h >> 10) & 0x1F, mant = h & 0x3FF;
  std::uint32_t bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal half: normalise into fp32 (exact)
    int e = -1;
    do { mant <<= 1; ++e; } while (!(mant & 0x400));
    bits = sign | std::uint32_t(112 - e) << 23 | ((mant & 0x3FF) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

std::uint16_t float_to_half(float f) {
  std::uint32_t x;
  std::memcpy(&x, &f, 4);
  std::uint32_t sign = (x >> 16) & 0x8000;
  std::uint32_t abs = x & 0x7FFFFFFF;
  if (abs > 0x7F800000u) return std::uint16_t(sign | 0x7E00);  // NaN
  if (abs >= 0x477FF000u) return std::uint16_t(sign | 0x7C00);  // rounds to inf
  if (abs < 0x38800000u) {  // subnormal or zero half: scale to an integer count of 2^-24
    if (abs < 0x33000000u) return std::uint16_t(sign);  // below half of the smallest subnormal
    std::uint32_t mant = (abs & 0x7FFFFF) | 0x800000;
    int shift = 126 - int(abs >> 23);  // 14..24
    std::uint32_t q = mant >> shift, rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1))) ++q;
    return std::uint16_t(sign | q);
  }
  std::uint32_t r = abs - 0x38000000u;  // rebias exponent 127 -> 15
  std::uint32_t q = r >> 13, rem = r & 0x1FFF;
  if (rem > 0x1000 || (rem == 0x1000 && (q & 1))) ++q;
  return std::uint16_t(sign | q);
}

Status dequantize_row(const Block* in, float* out, std::int64_t n) {
  ENCORE_RETURN_IF_ERROR(check_row("q4k::dequantize_row", in, out, n));
  for (std::int64_t b = 0; b < n / kBlockValues; ++b) {
    const Block& blk = in[b];
    std::uint8_t sc[8], m[8];
    unpack_scales(blk, sc, m);
    const float d = half_to_float(blk.d), dmin = half_to_float(blk.dmin);
    float* y = out + b * kBlockValues;
    for (int j = 0; j < kBlockValues; ++j) {
      const int s = j / 32;
      const std::uint8_t byte = blk.qs[32 * (j / 64) + j % 32];
      const int q = (s % 2 == 0) ? (byte & 0x0F) : (byte >> 4);
      y[j] = (d * sc[s]) * float(q) - dmin * m[s];
    }
  }
  return {};
}

namespace {

// ggml's nearest_int: round half to even through the 1.5*2^23 trick.
int nearest_int(float v) {
  float t = v + 12582912.f;
  std::int32_t i;
  std::memcpy(&i, &t, 4);
  return (i & 0x007FFFFF) - 0x00400000;
}

// ggml make_qkx2_quants(n=32, nmax=15, rmin=-1, rdelta=0.1, nstep=20, use_mad=false).
float fit_sub_block(const float* x, const float* w, std::uint8_t* L, float* the_min) {
  constexpr int n = 32, nmax = 15, nstep = 20;
  constexpr float rmin = -1.f, rdelta = 0.1f;
  float lo = x[0], hi = x[0], sum_w = w[0], sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < lo) lo = x[i];
    if (x[i] > hi) hi = x[i];
    sum_w += w[i];
    sum_x += w[i] * x[i];
  }
  if (lo > 0) lo = 0;
  if (hi == lo) {
    std::fill(L, L + n, 0);
    *the_min = -lo;
    return 0.f;
  }
  float iscale = nmax / (hi - lo);
  float scale = 1 / iscale;
  float best = 0;
  for (int i = 0; i < n; ++i) {
    int l = std::clamp(nearest_int(iscale * (x[i] - lo)), 0, nmax);
    L[i] = std::uint8_t(l);
    float diff = scale * L[i] + lo - x[i];
    best += w[i] * (diff * diff);
  }
  std::uint8_t aux[n];
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * is + nmax) / (hi - lo);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      int l = std::clamp(nearest_int(iscale * (x[i] - lo)), 0, nmax);
      aux[i] = std::uint8_t(l);
      sum_l += w[i] * l;
      sum_l2 += w[i] * l * l;
      sum_xl += w[i] * l * x[i];
    }
    float det = sum_w * sum_l2 - sum_l * sum_l;
    if (det > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
      if (this_min > 0) {
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      float err = 0;
      for (int i = 0; i < n; ++i) {
        float diff = this_scale * aux[i] + this_min - x[i];
        err += w[i] * (diff * diff);
      }
      if (err < best) {
        std::copy(aux, aux + n, L);
        best = err;
        scale = this_scale;
        lo = this_min;
      }
    }
  }
  *the_min = -lo;
  return scale;
}

}  // namespace

Status quantize_row(const float* in, Block* out, std::int64_t n) {
  ENCORE_RETURN_IF_ERROR(check_row("q4k::quantize_row", in, out, n));
  for (std::int64_t b = 0; b < n / kBlockValues; ++b) {
    const float* x = in + b * kBlockValues;
    Block& y = out[b];
    std::uint8_t L[kBlockValues];
    float scales[8], mins[8], weights[32];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; ++j) {
      float sum_x2 = 0;
      for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
      float av_x = std::sqrt(sum_x2 / 32);
      for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(x[32 * j + l]);
      scales[j] = fit_sub_block(x + 32 * j, weights, L + 32 * j, &mins[j]);
      if (scales[j] > max_scale) max_scale = scales[j];
      if (mins[j] > max_min) max_min = mins[j];
    }
    float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    std::uint8_t sc[8], m[8];
    for (int j = 0; j < 8; ++j) {
      sc[j] = std::min<std::uint8_t>(63, std::uint8_t(nearest_int(inv_scale * scales[j])));
      m[j] = std::min<std::uint8_t>(63, std::uint8_t(nearest_int(inv_min * mins[j])));
    }
    std::memset(y.scales, 0, sizeof(y.scales));
    pack_scales(sc, m, y);
    y.d = float_to_half(max_scale / 63.f);
    y.dmin = float_to_half(max_min / 63.f);
    for (int j = 0; j < 8; ++j) {
      const float d = half_to_float(y.d) * sc[j];
      if (d == 0.f) continue;
      const float dm = half_to_float(y.dmin) * m[j];
      for (int i = 0; i < 32; ++i) L[32 * j + i] = std::uint8_t(std::clamp(nearest_int((x[32 * j + i] + dm) / d), 0, 15));
    }
    for (int g = 0; g < 4; ++g)
      for (int l = 0; l < 32; ++l) y.qs[32 * g + l] = std::uint8_t(L[64 * g + l] | (L[64 * g + 32 + l] << 4));
  }
  return {};
}

}  // namespace encore::q4k
