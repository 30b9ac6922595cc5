#pragma once
// Floats written back in a file's element type: the inverse of convert_to_f32 for the float
// dtypes, rounding to nearest even, so a value that was read from a dtype goes back to the same
// bits (exports of LoRA weights rely on it).
#include <cstddef>
#include <cstdint>

#include "dtype.hpp"

namespace tilemoe::io {

// IEEE half; overflow gives infinity, NaN stays NaN with its payload's top bits.
std::uint16_t float_to_f16(float f);

// F32, BF16 and F16; any other dtype throws invalid_argument. `out` needs no alignment.
void convert_from_f32(const float* src, std::size_t count, Dtype dst, std::byte* out);

}  // namespace tilemoe::io
