#pragma once
// The bit-level dequantization every MXFP4 kernel computes: the bf16 bits of the E2M1 value,
// with the group's exponent added to the bf16 exponent field unless the value is ±0. Exact where
// pack_mxfp4.hpp says; outside that range the sum wraps like the vector kernels' 16-bit adds.
#include <cstdint>

#include "amx/pack_mxfp4.hpp"

namespace tilemoe::kernels {

// bf16 bits of kE2m1Values: 0.5 = 0x3f00, 1 = 0x3f80, 1.5 = 0x3fc0, 2 = 0x4000, 3 = 0x4040, ...
inline constexpr std::uint16_t kE2m1Bf16Bits[16] = {0x0000, 0x3f00, 0x3f80, 0x3fc0, 0x4000, 0x4040, 0x4080, 0x40c0,
                                                    0x8000, 0xbf00, 0xbf80, 0xbfc0, 0xc000, 0xc040, 0xc080, 0xc0c0};

// The 16-bit addend that multiplies a normal bf16 by 2^(exponent - 127).
inline std::uint16_t mxfp4_exponent_addend(int exponent) {
  return static_cast<std::uint16_t>(static_cast<unsigned>(exponent - kMxfp4ExponentBias) << 7);
}

inline bf16 mxfp4_scaled_bits(int code, int exponent) {
  const std::uint16_t bits = kE2m1Bf16Bits[code & 15];
  if ((bits & 0x7fffu) == 0) return bits;
  return static_cast<bf16>(bits + mxfp4_exponent_addend(exponent));
}

}  // namespace tilemoe::kernels
