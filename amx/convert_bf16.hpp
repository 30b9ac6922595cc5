#pragma once
// dst[i] = bf16(scale * src[i]) for i < n, rounded to nearest even as tilemoe::float_to_bf16 does
// (NaN stays NaN). The layer's f32 -> bf16 traffic: the backward's dY = w * dO rows and the
// gate/up values the fine-tuning forward keeps for backward.
#include <cstddef>

#include "tilemoe/bf16.hpp"

namespace tilemoe::kernels {

using ConvertToBf16Fn = void (*)(const float* src, std::size_t n, float scale, bf16* dst);

void convert_to_bf16_portable(const float* src, std::size_t n, float scale, bf16* dst);
// Only where isa_available(Isa::avx512_bf16).
void convert_to_bf16_avx512(const float* src, std::size_t n, float scale, bf16* dst);

}  // namespace tilemoe::kernels
