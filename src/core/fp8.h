// FP8 E4M3 (OCP's "e4m3fn": 1 sign, 4 exponent bits of bias 7, 3 mantissa bits; no infinity,
// 0x7f / 0xff are NaN; largest finite 448, smallest subnormal 2^-9) as the CPU side reads and
// writes it: the element type of FP8 weights and of the FP8 KV cache. Conversions from float
// round to nearest even and saturate to +-448 (infinities too), as the GPU's satfinite
// conversion does and as quantisers clamp before converting; NaN stays NaN.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace asynct {

constexpr float kFp8E4M3Max = 448.0f;

inline float fp8_e4m3_to_float(std::uint8_t bits) {
  const float sign = (bits & 0x80u) ? -1.0f : 1.0f;
  const int exponent = (bits >> 3) & 0xf, mantissa = bits & 0x7;
  if (exponent == 0xf && mantissa == 0x7) return std::copysign(std::nanf(""), sign);
  if (exponent == 0) return sign * std::ldexp(float(mantissa), -9);  // subnormal: m/8 * 2^-6
  return sign * std::ldexp(float(8 + mantissa), exponent - 10);       // (1 + m/8) * 2^(e-7)
}

inline std::uint8_t float_to_fp8_e4m3(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  const std::uint8_t sign = std::uint8_t((u >> 24) & 0x80u);
  const std::uint32_t magnitude = u & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return std::uint8_t(sign | 0x7f);  // NaN
  if (magnitude >= 0x43e00000u) return std::uint8_t(sign | 0x7e);  // >= 448 (infinity too): saturate
  const int exponent = int(magnitude >> 23) - 127;
  if (exponent < -6) {
    // Subnormal in e4m3: a multiple of 2^-9, rounded to nearest even (an exact product and the
    // current rounding mode, which is to nearest even); 8 of them is the smallest normal, 0x08.
    float a;
    std::memcpy(&a, &magnitude, 4);
    return std::uint8_t(sign | std::uint8_t(std::nearbyint(std::ldexp(a, 9))));
  }
  // Normal: the exponent rebiased, the 23 mantissa bits rounded to 3 (a carry moves into the
  // exponent, as it should); below 448, so at most 0x7e after rounding.
  std::uint32_t bits = (std::uint32_t(exponent + 7) << 3) | ((magnitude >> 20) & 0x7u);
  const std::uint32_t rest = magnitude & 0xfffffu;
  if (rest > 0x80000u || (rest == 0x80000u && (bits & 1u))) ++bits;
  return std::uint8_t(sign | (bits > 0x7eu ? 0x7eu : bits));
}

// Rounds a float through e4m3 (saturating).
inline float round_to_fp8_e4m3(float x) { return fp8_e4m3_to_float(float_to_fp8_e4m3(x)); }

}  // namespace asynct
