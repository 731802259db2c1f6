// fp16 and bf16 rounding (common/dtype.hpp). The oracle is fed exactly the values a
// low-precision step sees, so these conversions must be IEEE round-to-nearest-even at
// every edge: subnormals, ties, overflow, NaN and signed zero.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>

#include "dtype.hpp"

using namespace ladder;

namespace {

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

bool is_half_nan(uint16_t h) {
  return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0;
}
bool is_bf16_nan(uint16_t b) {
  return (b & 0x7f80u) == 0x7f80u && (b & 0x7fu) != 0;
}

const float kInf = std::numeric_limits<float>::infinity();

}  // namespace

TEST_CASE("fp16: exact values", "[dtype]") {
  CHECK(float_to_half_bits(1.0f) == 0x3c00);
  CHECK(half_bits_to_float(0x3c00) == 1.0f);
  CHECK(float_to_half_bits(-2.0f) == 0xc000);
  CHECK(float_to_half_bits(0.5f) == 0x3800);
  // The largest finite half.
  CHECK(float_to_half_bits(65504.0f) == 0x7bff);
  CHECK(half_bits_to_float(0x7bff) == 65504.0f);
  // The smallest normal, the largest and the smallest subnormal.
  CHECK(float_to_half_bits(std::ldexp(1.0f, -14)) == 0x0400);
  CHECK(float_to_half_bits(1023 * std::ldexp(1.0f, -24)) == 0x03ff);
  CHECK(float_to_half_bits(std::ldexp(1.0f, -24)) == 0x0001);
  CHECK(half_bits_to_float(0x0001) == std::ldexp(1.0f, -24));
  CHECK(half_bits_to_float(0x8001) == -std::ldexp(1.0f, -24));
  CHECK(half_bits_to_float(0x03ff) == 1023 * std::ldexp(1.0f, -24));
}

TEST_CASE("fp16: halfway cases round to even", "[dtype]") {
  const float ulp1 = std::ldexp(1.0f, -10);                  // the spacing of halves in [1, 2)
  CHECK(float_to_half_bits(1.0f + ulp1 / 2) == 0x3c00);      // tie, 1.0 is even: down
  CHECK(float_to_half_bits(1.0f + 3 * ulp1 / 2) == 0x3c02);  // tie, 0x3c01 is odd: up
  CHECK(float_to_half_bits(std::nextafter(1.0f + ulp1 / 2, 2.0f)) == 0x3c01);  // past the tie
  CHECK(float_to_half_bits(std::nextafter(1.0f + 3 * ulp1 / 2, 0.0f)) == 0x3c01);
  // Ties among subnormals (spacing 2^-24) and at zero.
  const float sub = std::ldexp(1.0f, -24);
  CHECK(float_to_half_bits(sub / 2) == 0x0000);  // tie between 0 and the smallest: 0
  CHECK(float_to_half_bits(std::nextafter(sub / 2, 1.0f)) == 0x0001);
  CHECK(float_to_half_bits(1.5f * sub) == 0x0002);  // tie between 1 and 2 units: 2
  CHECK(float_to_half_bits(2.5f * sub) == 0x0002);  // tie between 2 and 3 units: 2
  CHECK(float_to_half_bits(-2.5f * sub) == 0x8002);
  // A carry out of the mantissa into the exponent: the largest subnormal rounds up to the
  // smallest normal, and 2 - 2^-12 to 2.
  CHECK(float_to_half_bits(1023.5f * sub) == 0x0400);
  CHECK(float_to_half_bits(2.0f - std::ldexp(1.0f, -12)) == 0x4000);
}

TEST_CASE("fp16: overflow, NaN and signed zero", "[dtype]") {
  CHECK(float_to_half_bits(65519.0f) == 0x7bff);  // below the tie: the largest finite
  CHECK(float_to_half_bits(65520.0f) == 0x7c00);  // the tie with 65536 rounds to even: inf
  CHECK(float_to_half_bits(1e6f) == 0x7c00);
  CHECK(float_to_half_bits(-1e6f) == 0xfc00);
  CHECK(float_to_half_bits(kInf) == 0x7c00);
  CHECK(float_to_half_bits(-kInf) == 0xfc00);
  CHECK(std::isinf(half_bits_to_float(0x7c00)));
  CHECK(half_bits_to_float(0xfc00) == -kInf);

  CHECK(is_half_nan(float_to_half_bits(std::numeric_limits<float>::quiet_NaN())));
  CHECK(is_half_nan(float_to_half_bits(-std::numeric_limits<float>::quiet_NaN())));
  // A NaN whose payload sits only in bits a naive truncation drops must stay NaN.
  CHECK(is_half_nan(float_to_half_bits(from_bits(0x7f800001u))));
  CHECK(std::isnan(half_bits_to_float(0x7e00)));
  CHECK(std::isnan(half_bits_to_float(0x7c01)));

  CHECK(float_to_half_bits(-0.0f) == 0x8000);
  CHECK(float_to_half_bits(0.0f) == 0x0000);
  const float nz = half_bits_to_float(0x8000);
  CHECK(nz == 0.0f);
  CHECK(std::signbit(nz));
  CHECK(float_to_half_bits(-std::ldexp(1.0f, -30)) == 0x8000);  // underflow keeps the sign
}

TEST_CASE("bf16: exact values, ties, overflow, NaN and signed zero", "[dtype]") {
  CHECK(float_to_bf16_bits(1.0f) == 0x3f80);
  CHECK(bf16_bits_to_float(0x3f80) == 1.0f);
  CHECK(float_to_bf16_bits(-2.0f) == 0xc000);
  // Ties round to even: bf16 has 7 mantissa bits, spacing 2^-7 in [1, 2).
  const float ulp1 = std::ldexp(1.0f, -7);
  CHECK(float_to_bf16_bits(1.0f + ulp1 / 2) == 0x3f80);
  CHECK(float_to_bf16_bits(1.0f + 3 * ulp1 / 2) == 0x3f82);
  CHECK(float_to_bf16_bits(std::nextafter(1.0f + ulp1 / 2, 2.0f)) == 0x3f81);
  // The largest finite bf16, and overflow: the tie above it goes to inf (0x7f7f is odd).
  CHECK(float_to_bf16_bits(from_bits(0x7f7f0000u)) == 0x7f7f);
  CHECK(float_to_bf16_bits(from_bits(0x7f7f7fffu)) == 0x7f7f);
  CHECK(float_to_bf16_bits(from_bits(0x7f7f8000u)) == 0x7f80);
  CHECK(float_to_bf16_bits(std::numeric_limits<float>::max()) == 0x7f80);
  CHECK(float_to_bf16_bits(-std::numeric_limits<float>::max()) == 0xff80);
  CHECK(float_to_bf16_bits(kInf) == 0x7f80);
  CHECK(float_to_bf16_bits(-kInf) == 0xff80);
  // Subnormals: bf16 shares float's exponent range, so 2^-133 is its smallest.
  CHECK(float_to_bf16_bits(std::ldexp(1.0f, -133)) == 0x0001);
  CHECK(bf16_bits_to_float(0x0001) == std::ldexp(1.0f, -133));
  // NaN stays NaN, also one whose payload is only in the dropped low bits.
  CHECK(is_bf16_nan(float_to_bf16_bits(std::numeric_limits<float>::quiet_NaN())));
  CHECK(is_bf16_nan(float_to_bf16_bits(from_bits(0x7f800001u))));
  CHECK(is_bf16_nan(float_to_bf16_bits(from_bits(0xff800001u))));
  CHECK(std::isnan(bf16_bits_to_float(0x7fc0)));
  // Signed zero.
  CHECK(float_to_bf16_bits(-0.0f) == 0x8000);
  CHECK(std::signbit(bf16_bits_to_float(0x8000)));
  CHECK(bf16_bits_to_float(0x8000) == 0.0f);
}

TEST_CASE("fp16 and bf16: every value survives bits -> float -> bits", "[dtype]") {
  struct Format {
    const char* name;
    float (*to_float)(uint16_t);
    uint16_t (*to_bits)(float);
    bool (*is_nan)(uint16_t);
  };
  for (const Format& f : {Format{"half", half_bits_to_float, float_to_half_bits, is_half_nan},
                          Format{"bf16", bf16_bits_to_float, float_to_bf16_bits, is_bf16_nan}}) {
    int mismatches = 0;
    for (uint32_t h = 0; h <= 0xffffu; ++h) {
      const uint16_t back = f.to_bits(f.to_float(uint16_t(h)));
      const bool ok = f.is_nan(uint16_t(h)) ? f.is_nan(back) : back == h;
      if (!ok && mismatches++ < 5)
        FAIL_CHECK(f.name << " bits 0x" << std::hex << h << " -> 0x" << back);
    }
    CHECK(mismatches == 0);
  }
}

TEST_CASE("round_to: matches the bit conversions and is idempotent", "[dtype]") {
  // Machine epsilon 2u is the gap above 1: 1 + 2u is representable, 1 + u ties to 1.
  for (DType t : {DType::f32, DType::f16, DType::bf16}) {
    INFO(dtype_name(t));
    const double eps = 2 * unit_roundoff(t);
    CHECK(round_to(t, 1.0 + eps) == 1.0 + eps);
    CHECK(round_to(t, 1.0 + eps / 2) == 1.0);
    CHECK(round_to(t, 1.0 + 1.5 * eps) == 1.0 + 2 * eps);
  }
  CHECK(round_to(DType::f16, 65504.0) == 65504.0);
  CHECK(std::isinf(round_to(DType::f16, 1e5)));
  CHECK(round_to(DType::bf16, 1e5) == 99840.0);  // 1e5 = 1.52587890625 * 2^16 -> 1.5234375
  CHECK(round_to(DType::f32, 0.1) == double(0.1f));
  CHECK(round_to(DType::f64, 0.1) == 0.1);
  CHECK(std::isnan(round_to(DType::f16, std::nan(""))));
  CHECK(std::isnan(round_to(DType::bf16, std::nan(""))));
  CHECK(std::signbit(round_to(DType::f16, -0.0)));
  CHECK(std::signbit(round_to(DType::bf16, -0.0)));

  std::mt19937_64 rng(42);
  std::normal_distribution<double> n(0.0, 1.0);
  std::uniform_int_distribution<int> e(-40, 40);
  int checked = 0;
  for (int k = 0; k < 20000; ++k) {
    const double x = std::ldexp(n(rng), e(rng));  // values from subnormal fp16 to overflow
    for (DType t : {DType::f64, DType::f32, DType::f16, DType::bf16}) {
      const double once = round_to(t, x), twice = round_to(t, once);
      if (!(twice == once || (std::isnan(twice) && std::isnan(once)))) {
        FAIL("round_to(" << dtype_name(t) << ") not idempotent at " << x << ": " << once << " -> "
                         << twice);
      }
      // Rounding moves a normal value by at most the unit roundoff u (relative); fp16 and bf16
      // go through float first, which may add float's own half unit (2^-24).
      const double slack = dtype_bytes(t) == 2 ? 0x1p-24 : 0.0;
      if (std::isfinite(once) && std::fabs(x) > 1e-4 && std::fabs(x) < 6e4)
        CHECK(std::fabs(once - x) <= (unit_roundoff(t) + slack) * std::fabs(x));
      ++checked;
    }
  }
  CHECK(checked == 80000);
}

TEST_CASE("dtype names parse and unknown ones are rejected", "[dtype]") {
  DType t = DType::f64;
  CHECK(parse_dtype("fp16", t));
  CHECK(t == DType::f16);
  CHECK(parse_dtype("bfloat16", t));
  CHECK(t == DType::bf16);
  CHECK(parse_dtype("float32", t));
  CHECK(t == DType::f32);
  CHECK(parse_dtype("fp64", t));
  CHECK(t == DType::f64);
  CHECK_FALSE(parse_dtype("int8", t));
  CHECK_FALSE(parse_dtype("", t));
  CHECK(t == DType::f64);  // a failed parse leaves the value alone
  for (DType d : {DType::f64, DType::f32, DType::f16, DType::bf16}) {
    DType back = DType::f64;
    CHECK(parse_dtype(dtype_name(d), back));
    CHECK(back == d);
  }
  CHECK(dtype_bytes(DType::f16) == 2);
  CHECK(dtype_bytes(DType::bf16) == 2);
  CHECK(dtype_bytes(DType::f32) == 4);
  CHECK(dtype_bytes(DType::f64) == 8);
}
