#pragma once
// SwiGLU epilogue between the gate/up GEMMs and the down GEMM:
//   h[i][j] = bf16( silu(gate[i][j]) * up[i][j] ),  silu(g) = g / (1 + exp(-g))
// in the general form of SwigluForm (MoeShape): gate clamped to at most `limit` and up to
// [-limit, limit] first when limit > 0, as torch.clamp does (NaN stays NaN), then
//   h = (up + up_offset) * gate * sigmoid(alpha * gate)
// (gpt-oss: limit 7, alpha 1.702, up_offset 1; the plain SwiGLU: 0, 1, 0).
// computed in f32 and rounded to nearest even. NaN propagates as in PyTorch; silu(+inf) = +inf
// and silu(-inf) = -0, the limit (PyTorch's own kernels still give NaN there: pytorch/pytorch
// issue 160876). All ISAs give the same result up to the last bits of exp and of the reciprocal,
// except where AVX-512 rounds an f32 below 1.2e-38 to 0 (below).
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "tilemoe/bf16.hpp"

namespace tilemoe::kernels {

struct SwigluForm {
  float limit = 0.0f;      // > 0: the clamps; 0: none
  float alpha = 1.0f;      // sigmoid's slope
  float up_offset = 0.0f;  // added to the (clamped) up
  // The plain silu(g) * u, whose kernels run the code they ran before the general form.
  bool plain() const { return alpha == 1.0f && up_offset == 0.0f; }
};

using SiluMulBf16Fn = void (*)(const float* gate, std::size_t ldg, const float* up, std::size_t ldu, int m,
                               int n, bf16* h, std::size_t ldh, SwigluForm form);

void silu_mul_bf16_portable(const float* gate, std::size_t ldg, const float* up, std::size_t ldu, int m, int n,
                            bf16* h, std::size_t ldh, SwigluForm form);
// The portable kernel compiled for AVX2 + FMA + F16C; only where isa_available(Isa::avx2).
void silu_mul_bf16_avx2(const float* gate, std::size_t ldg, const float* up, std::size_t ldu, int m, int n,
                        bf16* h, std::size_t ldh, SwigluForm form);
// Only where isa_available(Isa::avx512_bf16). Its exp is accurate to about 2e-7 relative, and an
// h below the f32 normal range (|h| < 1.2e-38) becomes 0 (VCVTNEPS2BF16).
void silu_mul_bf16_avx512(const float* gate, std::size_t ldg, const float* up, std::size_t ldu, int m, int n,
                          bf16* h, std::size_t ldh, SwigluForm form);

// The epilogue's backward, with g, u the forward's gate and up (bf16, as the cache keeps them,
// row stride ldgu) and dh = dL/dh (f32):
//   s = sigmoid(g);  dup = dh * g * s;  dgate = dh * u * s * (1 + g * (1 - s))   (silu', exact)
// and in the general form (u' = u + up_offset): s = sigmoid(alpha g), dup = dh * g * s,
// dgate = dh * u' * s * (1 + alpha * g * (1 - s)).
// written as bf16 at row stride ldo; when h != nullptr also h, the forward's h recomputed for the
// down projection's LoRA gradient: the same ISA's silu_mul_bf16 of g and u, bit for bit. Same
// formulas as PyTorch's autograd, so NaN and infinities give what PyTorch gives (g = -inf: s = 0,
// dgate and dup NaN). With limit > 0, g and u are the clamped values in those formulas, and dgate
// (dup) is 0 where the unclamped g (u) lies outside the clamp's bounds, as torch.clamp's gradient
// (bounds included; NaN outside); the saved g and u keep their f32 sides (keep_clamp_sides).
using SiluMulBackwardFn = void (*)(const float* dh, std::size_t ldd, const bf16* gate, const bf16* up, std::size_t ldgu, int m, int n,
                                   bf16* dgate, bf16* dup, std::size_t ldo, bf16* h, std::size_t ldh, SwigluForm form);

void silu_mul_backward_portable(const float* dh, std::size_t ldd, const bf16* gate, const bf16* up, std::size_t ldgu, int m, int n,
                                bf16* dgate, bf16* dup, std::size_t ldo, bf16* h, std::size_t ldh, SwigluForm form);
// The portable kernel compiled for AVX2 + FMA + F16C; only where isa_available(Isa::avx2).
void silu_mul_backward_avx2(const float* dh, std::size_t ldd, const bf16* gate, const bf16* up, std::size_t ldgu, int m, int n,
                            bf16* dgate, bf16* dup, std::size_t ldo, bf16* h, std::size_t ldh, SwigluForm form);
// Only where isa_available(Isa::avx512_bf16). The sigmoid and the rounding of silu_mul_bf16_avx512:
// a dgate, dup or h below 1.2e-38 becomes 0.
void silu_mul_backward_avx512(const float* dh, std::size_t ldd, const bf16* gate, const bf16* up, std::size_t ldgu, int m, int n,
                              bf16* dgate, bf16* dup, std::size_t ldo, bf16* h, std::size_t ldh, SwigluForm form);

// What the forward saves of gate and up for the backward is bf16, where the clamp's decision (is g
// above limit? is u outside [-limit, limit]?) was the f32 value's. Rounding can carry a value
// within half a bf16 step of a bound across it, which would flip that element's whole gradient
// (torch.clamp passes none outside the bounds). After `saved` = bf16(values) (m rows, n columns),
// this moves each such element to the nearest bf16 on its f32 value's side of the bound: at most
// one bf16 step, and only next to the bounds. two_sided: up's bounds -limit and limit; else gate's
// limit alone. limit > 0.
using KeepClampSidesFn = void (*)(const float* values, std::size_t ldv, int m, int n, bf16* saved, std::size_t lds, float limit,
                                  bool two_sided);

void keep_clamp_sides_portable(const float* values, std::size_t ldv, int m, int n, bf16* saved, std::size_t lds, float limit,
                               bool two_sided);
// The portable kernel compiled for AVX2 + FMA + F16C; only where isa_available(Isa::avx2).
void keep_clamp_sides_avx2(const float* values, std::size_t ldv, int m, int n, bf16* saved, std::size_t lds, float limit,
                           bool two_sided);
// Only where isa_available(Isa::avx512_bf16).
void keep_clamp_sides_avx512(const float* values, std::size_t ldv, int m, int n, bf16* saved, std::size_t lds, float limit,
                             bool two_sided);

// The bf16 neighbours of a bound 0 < limit: the largest bf16 <= limit and the smallest > it.
struct ClampBoundBf16 {
  bf16 at_or_below, above;
};
inline ClampBoundBf16 clamp_bound_bf16(float limit) {
  std::uint32_t bits;
  std::memcpy(&bits, &limit, sizeof bits);
  const auto truncated = static_cast<bf16>(bits >> 16);  // a positive value truncates downward
  return {truncated, static_cast<bf16>(truncated + 1)};
}

}  // namespace tilemoe::kernels
