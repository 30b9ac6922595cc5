#pragma once
// dst[i] = bf16(scale * src[i]) for i < n, rounded to nearest even as tilemoe::float_to_bf16 does
// (NaN stays NaN). The layer's f32 -> bf16 traffic: the backward's dY = w * dO rows and the
// gate/up values the fine-tuning forward keeps for backward.
#include <cstddef>

#include "amx/prefetch.hpp"
#include "tilemoe/bf16.hpp"

namespace tilemoe::kernels {

using ConvertToBf16Fn = void (*)(const float* src, std::size_t n, float scale, bf16* dst);

void convert_to_bf16_portable(const float* src, std::size_t n, float scale, bf16* dst);
// The portable kernel compiled for AVX2 + FMA + F16C; only where isa_available(Isa::avx2).
void convert_to_bf16_avx2(const float* src, std::size_t n, float scale, bf16* dst);
// Only where isa_available(Isa::avx512_bf16).
void convert_to_bf16_avx512(const float* src, std::size_t n, float scale, bf16* dst);

// `rows` rows of n values: dst row i (ldd apart) = bf16(scale * src row i (lds apart)). An item's
// block of C goes out this way into rows a few KiB apart (dX, y, the saved gate and up), so each
// destination row is asked for kPrefetchRowsAhead rows early (prefetch.hpp): the stores'
// misses then overlap instead of waiting one row at a time.
inline void convert_rows_to_bf16(ConvertToBf16Fn convert, const float* src, std::size_t lds, int rows, std::size_t n, float scale, bf16* dst,
                                 std::size_t ldd) {
  for (int i = 0; i < rows; ++i) {
    if (i + kPrefetchRowsAhead < rows) prefetch_range(dst + static_cast<std::size_t>(i + kPrefetchRowsAhead) * ldd, n * sizeof(bf16));
    convert(src + static_cast<std::size_t>(i) * lds, n, scale, dst + static_cast<std::size_t>(i) * ldd);
  }
}

}  // namespace tilemoe::kernels
