// Scalar conversions between float32 and the 16-bit float formats (IEEE
// binary16 and bfloat16). Float-to-16-bit rounds to nearest, ties to even;
// NaN stays NaN (quiet, sign and the top payload bits kept); overflow gives
// infinity. These are the reference the SIMD variants must agree with.
#pragma once
#include <cstdint>
#include <cstring>

namespace fastps {
namespace half {

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// ---- bfloat16: the top 16 bits of a float32 ----

inline float bf16_to_float(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }

inline uint16_t float_to_bf16(float f) {
  const uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep sign/payload top, force quiet
    return static_cast<uint16_t>((u >> 16) | 0x0040u);
  }
  // Add 0x7fff plus the lowest kept bit: ties go to the even neighbour. A carry
  // out of the mantissa bumps the exponent, which is the correct result
  // (including rounding the largest finite values up to infinity).
  const uint32_t lsb = (u >> 16) & 1u;
  return static_cast<uint16_t>((u + 0x7fffu + lsb) >> 16);
}

// ---- IEEE binary16 ----

inline float fp16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  if (exp == 0x1f) {  // inf / NaN (NaN made quiet, as the hardware does)
    return bits_float(sign | 0x7f800000u | (man << 13) | (man ? 0x00400000u : 0u));
  }
  if (exp == 0) {
    // Zero or subnormal: man * 2^-24, exact in float32.
    const float mag = static_cast<float>(man) * 5.9604644775390625e-8f;
    return bits_float(sign | float_bits(mag));
  }
  return bits_float(sign | ((exp + 112u) << 23) | (man << 13));
}

inline uint16_t float_to_fp16(float f) {
  const uint32_t u = float_bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t x = u & 0x7fffffffu;
  if (x > 0x7f800000u) {  // NaN
    return static_cast<uint16_t>(sign | 0x7e00u | ((x >> 13) & 0x3ffu));
  }
  // 0x477ff000 is 65520, halfway between the largest half (65504, odd
  // mantissa) and 65536: ties-to-even sends it and anything above to infinity.
  if (x >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);
  if (x >= 0x38800000u) {                // normal half range (>= 2^-14)
    const uint32_t r = x - 0x38000000u;  // rebias exponent 127 -> 15
    const uint32_t lsb = (r >> 13) & 1u;
    return static_cast<uint16_t>(sign | ((r + 0xfffu + lsb) >> 13));
  }
  // 2^-25 (0x33000000) is halfway between 0 and the smallest subnormal; the
  // tie goes to the even neighbour, zero.
  if (x <= 0x33000000u) return sign;
  // Subnormal half: round(value / 2^-24). value = m * 2^(e - 150) with the
  // implicit bit in m, so value / 2^-24 = m >> (126 - e), shift in [14, 24].
  const uint32_t e = x >> 23;
  const uint32_t m = (x & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126u - e;
  uint32_t r = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u);
  const uint32_t halfway = 1u << (shift - 1u);
  if (rem > halfway || (rem == halfway && (r & 1u))) ++r;
  return static_cast<uint16_t>(sign | r);
}

}  // namespace half
}  // namespace fastps
