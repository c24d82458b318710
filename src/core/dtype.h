// Element types and the bf16/fp16 <-> float conversions the CPU side needs.
// Conversions round to nearest even, as the GPU's __float2bfloat16 does.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

namespace asynct {

// F8E4M3: FP8 e4m3fn (core/fp8.h), the element type of FP8 weights.
enum class DType : std::uint8_t { F32, F64, BF16, F16, I32, I64, U8, F8E4M3 };

constexpr std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::F64:
    case DType::I64: return 8;
    case DType::F32:
    case DType::I32: return 4;
    case DType::BF16:
    case DType::F16: return 2;
    case DType::U8:
    case DType::F8E4M3: return 1;
  }
  return 0;
}

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "float32";
    case DType::F64: return "float64";
    case DType::BF16: return "bfloat16";
    case DType::F16: return "float16";
    case DType::I32: return "int32";
    case DType::I64: return "int64";
    case DType::U8: return "uint8";
    case DType::F8E4M3: return "float8_e4m3fn";
  }
  return "?";
}

// The C++ type that stands for each DType, for typed access.
template <typename T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr DType value = DType::F32; };
template <> struct dtype_of<double> { static constexpr DType value = DType::F64; };
template <> struct dtype_of<std::int32_t> { static constexpr DType value = DType::I32; };
template <> struct dtype_of<std::int64_t> { static constexpr DType value = DType::I64; };
template <> struct dtype_of<std::uint8_t> { static constexpr DType value = DType::U8; };

// bf16 and fp16 are stored as raw 16-bit patterns on the host.
struct bf16_bits { std::uint16_t bits; };
struct f16_bits { std::uint16_t bits; };
struct fp8_e4m3_bits { std::uint8_t bits; };
template <> struct dtype_of<bf16_bits> { static constexpr DType value = DType::BF16; };
template <> struct dtype_of<f16_bits> { static constexpr DType value = DType::F16; };
template <> struct dtype_of<fp8_e4m3_bits> { static constexpr DType value = DType::F8E4M3; };

inline float bf16_to_float(std::uint16_t bits) {
  std::uint32_t u = std::uint32_t(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline std::uint16_t float_to_bf16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return std::uint16_t((u >> 16) | 0x40);  // keep NaN a NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return std::uint16_t(u >> 16);
}

// Rounds a float through bf16, the precision GPU inputs have.
inline float round_to_bf16(float f) { return bf16_to_float(float_to_bf16(f)); }

float f16_to_float(std::uint16_t bits);
std::uint16_t float_to_f16(float f);

}  // namespace asynct
