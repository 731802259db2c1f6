#include "dtype.hpp"

namespace ladder {

bool parse_dtype(const std::string& s, DType& out) {
  if (s == "fp64" || s == "float64" || s == "f64")
    out = DType::f64;
  else if (s == "fp32" || s == "float32" || s == "f32")
    out = DType::f32;
  else if (s == "fp16" || s == "float16" || s == "f16" || s == "half")
    out = DType::f16;
  else if (s == "bf16" || s == "bfloat16")
    out = DType::bf16;
  else
    return false;
  return true;
}

uint16_t float_to_half_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return uint16_t(sign | 0x7e00u);   // NaN
  if (abs >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds to inf
  if (abs < 0x33000001u) return uint16_t(sign);             // rounds to zero
  int exp = int(abs >> 23) - 127;
  uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
  int shift;  // bits to drop from the 24-bit mantissa
  uint32_t hexp;
  if (exp < -14) {  // subnormal half
    shift = 13 + (-14 - exp);
    hexp = 0;
  } else {
    shift = 13;
    hexp = uint32_t(exp + 15);
    mant &= 0x7fffffu;
  }
  uint32_t kept = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (kept & 1u))) kept++;
  // A carry out of the mantissa rolls into the exponent field, which is right.
  return uint16_t(sign | ((hexp << 10) + kept));
}

float half_bits_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  float f;
  if (exp == 0) {
    f = std::ldexp(float(mant), -24);
    uint32_t u;
    std::memcpy(&u, &f, 4);
    u |= sign;
    std::memcpy(&f, &u, 4);
    return f;
  }
  uint32_t u =
      exp == 31 ? (sign | 0x7f800000u | (mant << 13)) : (sign | ((exp + 112) << 23) | (mant << 13));
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace ladder
