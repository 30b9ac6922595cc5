#pragma once
// MXFP4, the OCP microscaling 4-bit format gpt-oss ships its experts in: groups of 32 consecutive
// inputs of a row, each an E2M1 code (two a byte, the first in the low nibble) scaled by one
// power of two, 2^(e - 127) with e an E8M0 byte. The checkpoint readers, the quantizer and the
// kernels' packing (amx/pack_mxfp4.hpp) all read the format through this header.
#include <cstddef>
#include <cstdint>

namespace tilemoe {

inline constexpr int kMxfp4Group = 32;
inline constexpr std::size_t kMxfp4GroupBytes = kMxfp4Group / 2;
inline constexpr int kMxfp4ExponentBias = 127;

// E2M1: bit 3 the sign, bits 2..1 the exponent (bias 1), bit 0 the mantissa.
inline constexpr float kE2m1Values[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                          -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

// A checkpoint's stack of MXFP4 matrices, one per expert: codes ("*_blocks", U8 [experts][rows]
// [groups][16]) and exponents ("*_scales", U8 [experts][rows][groups]). A projection may be every
// row_step-th row from first_row (gate and up interleaved in gpt-oss's gate_up_proj).
struct Mxfp4StackRows {
  std::size_t rows_per_expert = 0, groups = 0;
  int first_row = 0, row_step = 1;

  // Stack row of row i of expert e's projection.
  std::size_t row(std::size_t expert, std::size_t i) const {
    return expert * rows_per_expert + static_cast<std::size_t>(first_row) + i * static_cast<std::size_t>(row_step);
  }
  std::size_t code_offset(std::size_t expert, std::size_t i) const { return row(expert, i) * groups * kMxfp4GroupBytes; }
  std::size_t exponent_offset(std::size_t expert, std::size_t i) const { return row(expert, i) * groups; }
  // One expert's share of each tensor (all its rows, every projection interleaved in them).
  std::size_t expert_code_bytes() const { return rows_per_expert * groups * kMxfp4GroupBytes; }
  std::size_t expert_exponent_bytes() const { return rows_per_expert * groups; }
};

}  // namespace tilemoe
