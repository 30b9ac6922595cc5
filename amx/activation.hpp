#pragma once
// SwiGLU epilogue between the gate/up GEMMs and the down GEMM:
//   h[i][j] = bf16( silu(gate[i][j]) * up[i][j] ),  silu(g) = g / (1 + exp(-g))
// computed in f32 and rounded to nearest even. NaN propagates; silu(+inf) = +inf and
// silu(-inf) = -0, as in PyTorch. All ISAs give the same result up to the last bit of exp.
#include <cstddef>

#include "tilemoe/bf16.hpp"

namespace tilemoe::kernels {

using SiluMulBf16Fn = void (*)(const float* gate, std::size_t ldg, const float* up, std::size_t ldu, int m,
                               int n, bf16* h, std::size_t ldh);

void silu_mul_bf16_portable(const float* gate, std::size_t ldg, const float* up, std::size_t ldu, int m, int n,
                            bf16* h, std::size_t ldh);
// Only where isa_available(Isa::avx512_bf16). Its exp is accurate to about 2e-7 relative.
void silu_mul_bf16_avx512(const float* gate, std::size_t ldg, const float* up, std::size_t ldu, int m, int n,
                          bf16* h, std::size_t ldh);

}  // namespace tilemoe::kernels
