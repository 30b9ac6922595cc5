#pragma once
// bfloat16 stored as its raw 16 bits. Conversions follow PyTorch: round to nearest even, NaN
// stays NaN (quiet), infinities and signed zeros are kept.
#include <cstdint>
#include <cstring>

namespace tilemoe {

using bf16 = std::uint16_t;

inline float bf16_to_float(bf16 v) {
  std::uint32_t bits = static_cast<std::uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// False for Inf and NaN (an all-ones exponent).
inline bool bf16_is_finite(bf16 v) { return (v & 0x7f80u) != 0x7f80u; }

inline bf16 float_to_bf16(float f) {
  std::uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<bf16>((bits >> 16) | 0x0040u);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<bf16>(bits >> 16);
}

// IEEE half to float, for F16 checkpoints (no F16C needed: loaders run on any x86-64).
inline float f16_to_float(std::uint16_t h) {
  std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t man = h & 0x3ffu;
  std::uint32_t bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do { ++e; man <<= 1; } while ((man & 0x400u) == 0);
      bits = sign | (static_cast<std::uint32_t>(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// FP8 E4M3 (the "fn" variant: no infinities, 0x7f/0xff are NaN) to float.
inline float f8e4m3_to_float(std::uint8_t v) {
  std::uint32_t sign = static_cast<std::uint32_t>(v & 0x80u) << 24;
  std::uint32_t exp = (v >> 3) & 0xfu;
  std::uint32_t man = v & 0x7u;
  std::uint32_t bits;
  if (exp == 0xf && man == 0x7) {
    bits = sign | 0x7fc00000u;
  } else if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {
      int e = -1;
      do { ++e; man <<= 1; } while ((man & 0x8u) == 0);
      bits = sign | (static_cast<std::uint32_t>(127 - 7 - e) << 23) | ((man & 0x7u) << 20);
    }
  } else {
    bits = sign | ((exp + 127 - 7) << 23) | (man << 20);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

}  // namespace tilemoe
