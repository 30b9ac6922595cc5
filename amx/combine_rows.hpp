#pragma once
// out[c] = sum over j < count of weights[j] * rows[j][c] for c < width (weights null: 1 each),
// accumulated in f32 in the order j = 0, 1, ...; out is overwritten (zeros for count 0). The
// forward's combine of one token: its routed slots' down outputs, held as bf16 rows, weighted by
// the router. NaN and Inf propagate as in a plain sum.
#include <cstddef>

#include "tilemoe/bf16.hpp"

namespace tilemoe::kernels {

using CombineBf16RowsFn = void (*)(const bf16* const* rows, const float* weights, int count, std::size_t width, float* out);

void combine_bf16_rows_portable(const bf16* const* rows, const float* weights, int count, std::size_t width, float* out);
// The portable kernel compiled for AVX2 + FMA + F16C; only where isa_available(Isa::avx2).
void combine_bf16_rows_avx2(const bf16* const* rows, const float* weights, int count, std::size_t width, float* out);
// Only where isa_available(Isa::avx512_bf16).
void combine_bf16_rows_avx512(const bf16* const* rows, const float* weights, int count, std::size_t width, float* out);

}  // namespace tilemoe::kernels
