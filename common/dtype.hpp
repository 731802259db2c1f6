// Element types of the ladder and host-side rounding to them, so that the
// float64 oracle sees exactly the input values a low-precision step sees.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

namespace ladder {

enum class DType { f64, f32, f16, bf16 };

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::f64:
      return "fp64";
    case DType::f32:
      return "fp32";
    case DType::f16:
      return "fp16";
    case DType::bf16:
      return "bf16";
  }
  return "?";
}

// Accepts fp64/fp32/fp16/bf16 (and float64/float32/float16 spellings).
bool parse_dtype(const std::string& s, DType& out);

inline int dtype_bytes(DType t) {
  switch (t) {
    case DType::f64:
      return 8;
    case DType::f32:
      return 4;
    default:
      return 2;
  }
}

// Unit roundoff u of each type: half the gap between 1 and the next number, the largest
// relative error of one rounding to nearest (2^-53 fp64, 2^-24 fp32, 2^-11 fp16, 2^-8 bf16).
// Machine epsilon is 2u.
inline double unit_roundoff(DType t) {
  switch (t) {
    case DType::f64:
      return 0x1p-53;
    case DType::f32:
      return 0x1p-24;
    case DType::f16:
      return 0x1p-11;
    case DType::bf16:
      return 0x1p-8;
  }
  return 0;
}

// The type a step of dtype t accumulates in (and stores LSE in): fp32, or fp64 for fp64.
inline DType accumulation_type(DType t) {
  return t == DType::f64 ? DType::f64 : DType::f32;
}

// IEEE binary16 and bfloat16 bit conversions, round to nearest even.
uint16_t float_to_half_bits(float f);
float half_bits_to_float(uint16_t h);
inline uint16_t float_to_bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
inline float bf16_bits_to_float(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// The value x takes when stored as `t` (double -> t -> double).
inline double round_to(DType t, double x) {
  switch (t) {
    case DType::f64:
      return x;
    case DType::f32:
      return double(float(x));
    case DType::f16:
      return half_bits_to_float(float_to_half_bits(float(x)));
    case DType::bf16:
      return bf16_bits_to_float(float_to_bf16_bits(float(x)));
  }
  return x;
}

}  // namespace ladder
