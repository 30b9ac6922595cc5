#include "amx/immintrin_gcc12.hpp"

#include <cmath>
#include <cstddef>

#include "amx/activation.hpp"
#include "amx/bf16_avx512.hpp"
#include "amx/prefetch.hpp"

namespace tilemoe::kernels {
namespace {

// exp(x) = 2^n * e^r with n = round(x / ln2) and |r| <= ln2/2; e^r from Cephes' expf
// polynomial (about 1e-7 relative). ln2 is split in two so that r keeps its low bits, and
// VSCALEFPS applies 2^n with correct overflow to +inf and gradual underflow to 0.
inline __m512 exp_avx512(__m512 x) {
  // Clamped so that n stays small enough for scalef; min/max take the constant first so that a
  // NaN in x comes through.
  x = _mm512_min_ps(_mm512_set1_ps(89.0f), x);
  x = _mm512_max_ps(_mm512_set1_ps(-104.0f), x);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);
}

// sigmoid(g) as 1 / (1 + e^-g) for g >= 0 and e^g / (1 + e^g) below: the denominator stays in
// (1, 2], so its reciprocal is VRCP14PS and one Newton step (about 2^-28 relative) with no
// infinity to meet, and no VDIVPS.
inline __m512 sigmoid_avx512(__m512 g) {
  const __m512 t = exp_avx512(_mm512_or_ps(g, _mm512_set1_ps(-0.0f)));  // e^-|g| in [0, 1]
  const __m512 d = _mm512_add_ps(_mm512_set1_ps(1.0f), t);
  __m512 r = _mm512_rcp14_ps(d);
  r = _mm512_fmadd_ps(_mm512_fnmadd_ps(d, r, _mm512_set1_ps(1.0f)), r, r);
  const __mmask16 negative = _mm512_cmp_ps_mask(g, _mm512_setzero_ps(), _CMP_LT_OQ);
  return _mm512_mask_mul_ps(r, negative, t, r);
}

inline __m512 silu_mul(__m512 g, __m512 u) {
  __m512 s = _mm512_mul_ps(g, sigmoid_avx512(g));
  // -inf * 0 is NaN; the limit is -0.
  const __mmask16 minus_inf = _mm512_cmp_ps_mask(g, _mm512_set1_ps(-INFINITY), _CMP_EQ_OQ);
  s = _mm512_mask_mov_ps(s, minus_inf, _mm512_set1_ps(-0.0f));
  return _mm512_mul_ps(s, u);
}

// The general form's (u + up_offset) * g * sigmoid(alpha g), offset already in u.
inline __m512 silu_mul_general(__m512 g, __m512 u, __m512 alpha) {
  __m512 s = _mm512_mul_ps(g, sigmoid_avx512(_mm512_mul_ps(alpha, g)));
  // -inf * 0 is NaN; the limit is -0.
  const __mmask16 minus_inf = _mm512_cmp_ps_mask(g, _mm512_set1_ps(-INFINITY), _CMP_EQ_OQ);
  s = _mm512_mask_mov_ps(s, minus_inf, _mm512_set1_ps(-0.0f));
  return _mm512_mul_ps(s, u);
}

// h is rounded by VCVTNEPS2BF16 (to nearest even, as to_bf16, but an f32 below the normal range,
// 1.2e-38, becomes 0): on the device (held r = 16, three variants taking turns, two processes)
// that and the sigmoid above took bf16 at 4096 tokens 0.4-2.2 % and int8 0.9-3.3 % less time,
// 512 tokens 0.1-0.9 %; the sigmoid with to_bf16 was no faster than VDIVPS with to_bf16.
inline __m256i h_to_bf16(__m512 v) { return (__m256i)_mm512_cvtneps_pbh(v); }

// A swiglu_limit's clamps (activation.hpp); the limit is the first operand of min / max so that a
// NaN in v comes through, as in torch.clamp. Also the general form's alpha and up_offset.
struct SwigluClamp {
  __m512 limit, minus_limit, alpha, up_offset;
  explicit SwigluClamp(SwigluForm f)
      : limit(_mm512_set1_ps(f.limit)), minus_limit(_mm512_set1_ps(-f.limit)), alpha(_mm512_set1_ps(f.alpha)),
        up_offset(_mm512_set1_ps(f.up_offset)) {}
  __m512 gate(__m512 g) const { return _mm512_min_ps(limit, g); }
  __m512 up(__m512 u) const { return _mm512_max_ps(minus_limit, _mm512_min_ps(limit, u)); }
  // Where torch.clamp passes the gradient: the input within the bounds (NaN is not).
  __mmask16 gate_passes(__m512 g) const { return _mm512_cmp_ps_mask(g, limit, _CMP_LE_OQ); }
  __mmask16 up_passes(__m512 u) const {
    return _mm512_mask_cmp_ps_mask(_mm512_cmp_ps_mask(u, limit, _CMP_LE_OQ), u, minus_limit, _CMP_GE_OQ);
  }
};

// One vector of silu_mul_backward; `mask` selects the columns that exist. One sigmoid serves all
// three outputs, and h is the forward's silu_mul bit for bit (the same sigmoid and rounding): with
// VDIVPS and the emulated rounding it had differed from the forward's h in its last bits and at
// g = -inf. On the device (fine-tuning step, r = 16, both forms taking turns, three processes)
// 512 tokens took -0.4 to +0.1 % and 4096 tokens -1.8 to +0.6 %: the same time.
template <bool kClamp, bool kGeneral>
inline void silu_backward_vec(__mmask16 mask, const float* d, const bf16* g16, const bf16* u16, bf16* dg, bf16* du, bf16* h,
                              const SwigluClamp& clamp) {
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 dh = _mm512_maskz_loadu_ps(mask, d);
  __m512 g = bf16_to_f32(_mm256_maskz_loadu_epi16(mask, g16));
  __m512 u = bf16_to_f32(_mm256_maskz_loadu_epi16(mask, u16));
  __mmask16 g_passes = mask, u_passes = mask;
  if constexpr (kClamp) {
    g_passes = clamp.gate_passes(g);
    u_passes = clamp.up_passes(u);
    g = clamp.gate(g);
    u = clamp.up(u);
  }
  if constexpr (kGeneral) u = _mm512_add_ps(u, clamp.up_offset);
  // At g = -inf, s = 0 (e^-104 rounds to 0): g s and silu' are NaN there, as in PyTorch's autograd.
  const __m512 ag = kGeneral ? _mm512_mul_ps(clamp.alpha, g) : g;
  const __m512 s = sigmoid_avx512(ag);
  const __m512 silu = _mm512_mul_ps(g, s);
  _mm256_mask_storeu_epi16(du, mask, h_to_bf16(_mm512_maskz_mov_ps(u_passes, _mm512_mul_ps(dh, silu))));
  const __m512 dsilu = _mm512_mul_ps(s, _mm512_fmadd_ps(ag, _mm512_sub_ps(one, s), one));
  _mm256_mask_storeu_epi16(dg, mask, h_to_bf16(_mm512_maskz_mov_ps(g_passes, _mm512_mul_ps(_mm512_mul_ps(dh, u), dsilu))));
  if (h) {
    // silu_mul's limit at -inf.
    const __mmask16 minus_inf = _mm512_cmp_ps_mask(g, _mm512_set1_ps(-INFINITY), _CMP_EQ_OQ);
    const __m512 forward_silu = _mm512_mask_mov_ps(silu, minus_inf, _mm512_set1_ps(-0.0f));
    _mm256_mask_storeu_epi16(h, mask, h_to_bf16(_mm512_mul_ps(forward_silu, u)));
  }
}

// silu_mul_backward asks for the rows kPrefetchRowsAhead on: the saved gate and up (read) and
// the dG and dU they become (written). In the backward each row of these is a few hundred bytes
// of a 2.8-5.6 KB row in memory, a stride the hardware prefetchers do not follow, and the
// loop's own loads and stores reach about one row ahead, so each row waited on its misses.
// On the device (512 tokens of DeepSeek-V2-Lite, r=16), with the gradient blocks asked for
// likewise (moe_backward.cpp), the dh phase went from 0.45 to 0.39 times the forward_sft and the
// whole backward from 1.11 to 1.08 (means of four rounds each; docs/perf.md, session 30).
template <bool kClamp, bool kGeneral>
void silu_mul_backward_rows(const float* dh, std::size_t ldd, const bf16* gate, const bf16* up, std::size_t ldgu, int m, int n,
                            bf16* dgate, bf16* dup, std::size_t ldo, bf16* h, std::size_t ldh, SwigluForm form) {
  const SwigluClamp clamp(form);
  const std::size_t row_bytes = static_cast<std::size_t>(n) * sizeof(bf16);
  for (int i = 0; i < m; ++i) {
    if (i + kPrefetchRowsAhead < m) {
      const std::size_t r = static_cast<std::size_t>(i + kPrefetchRowsAhead);
      prefetch_range(gate + r * ldgu, row_bytes);
      prefetch_range(up + r * ldgu, row_bytes);
      prefetch_range(dgate + r * ldo, row_bytes);
      prefetch_range(dup + r * ldo, row_bytes);
    }
    const float* di = dh + i * ldd;
    const bf16* gi = gate + i * ldgu;
    const bf16* ui = up + i * ldgu;
    bf16* dgi = dgate + i * ldo;
    bf16* dui = dup + i * ldo;
    bf16* hi = h ? h + i * ldh : nullptr;
    for (int j = 0; j < n; j += 16) {
      const __mmask16 mask = lanes16(n - j);
      silu_backward_vec<kClamp, kGeneral>(mask, di + j, gi + j, ui + j, dgi + j, dui + j, hi ? hi + j : nullptr, clamp);
    }
  }
}

template <bool kClamp, bool kGeneral>
void silu_mul_rows(const float* gate, std::size_t ldg, const float* up, std::size_t ldu, int m, int n, bf16* h, std::size_t ldh,
                   SwigluForm form) {
  const SwigluClamp clamp(form);
  auto product = [&](__m512 g, __m512 u) {
    if constexpr (kClamp) {
      g = clamp.gate(g);
      u = clamp.up(u);
    }
    if constexpr (kGeneral) return silu_mul_general(g, _mm512_add_ps(u, clamp.up_offset), clamp.alpha);
    return silu_mul(g, u);
  };
  for (int i = 0; i < m; ++i) {
    const float* gi = gate + i * ldg;
    const float* ui = up + i * ldu;
    bf16* hi = h + i * ldh;
    int j = 0;
    for (; j + 16 <= n; j += 16) {
      const __m512 v = product(_mm512_loadu_ps(gi + j), _mm512_loadu_ps(ui + j));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(hi + j), h_to_bf16(v));
    }
    if (j < n) {
      const __mmask16 mask = lanes16(n - j);
      const __m512 v = product(_mm512_maskz_loadu_ps(mask, gi + j), _mm512_maskz_loadu_ps(mask, ui + j));
      _mm256_mask_storeu_epi16(hi + j, mask, h_to_bf16(v));
    }
  }
}

}  // namespace

void silu_mul_backward_avx512(const float* dh, std::size_t ldd, const bf16* gate, const bf16* up, std::size_t ldgu, int m, int n,
                              bf16* dgate, bf16* dup, std::size_t ldo, bf16* h, std::size_t ldh, SwigluForm form) {
  const bool clamp = form.limit > 0.0f;
  if (!form.plain())
    return clamp ? silu_mul_backward_rows<true, true>(dh, ldd, gate, up, ldgu, m, n, dgate, dup, ldo, h, ldh, form)
                 : silu_mul_backward_rows<false, true>(dh, ldd, gate, up, ldgu, m, n, dgate, dup, ldo, h, ldh, form);
  if (clamp)
    silu_mul_backward_rows<true, false>(dh, ldd, gate, up, ldgu, m, n, dgate, dup, ldo, h, ldh, form);
  else
    silu_mul_backward_rows<false, false>(dh, ldd, gate, up, ldgu, m, n, dgate, dup, ldo, h, ldh, form);
}

void silu_mul_bf16_avx512(const float* gate, std::size_t ldg, const float* up, std::size_t ldu, int m, int n,
                          bf16* h, std::size_t ldh, SwigluForm form) {
  const bool clamp = form.limit > 0.0f;
  if (!form.plain())
    return clamp ? silu_mul_rows<true, true>(gate, ldg, up, ldu, m, n, h, ldh, form)
                 : silu_mul_rows<false, true>(gate, ldg, up, ldu, m, n, h, ldh, form);
  if (clamp)
    silu_mul_rows<true, false>(gate, ldg, up, ldu, m, n, h, ldh, form);
  else
    silu_mul_rows<false, false>(gate, ldg, up, ldu, m, n, h, ldh, form);
}

void keep_clamp_sides_avx512(const float* values, std::size_t ldv, int m, int n, bf16* saved, std::size_t lds, float limit,
                             bool two_sided) {
  const ClampBoundBf16 b = clamp_bound_bf16(limit);
  const __m512 hi = _mm512_set1_ps(limit), lo = _mm512_set1_ps(-limit);
  const __m256i above = _mm256_set1_epi16(static_cast<short>(b.above)), at_or_below = _mm256_set1_epi16(static_cast<short>(b.at_or_below));
  const __m256i sign = _mm256_set1_epi16(static_cast<short>(0x8000));
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; j += 16) {
      const __mmask16 lanes = lanes16(n - j);
      const __m512 v = _mm512_maskz_loadu_ps(lanes, values + i * ldv + j);
      bf16* out = saved + i * lds + j;
      __m256i s = _mm256_maskz_loadu_epi16(lanes, out);
      const __m512 r = bf16_to_f32(s);
      // _CMP_GT_OQ is false for NaN: a NaN value or saved element is never moved.
      const __mmask16 v_over = _mm512_cmp_ps_mask(v, hi, _CMP_GT_OQ), r_over = _mm512_cmp_ps_mask(r, hi, _CMP_GT_OQ);
      __mmask16 moved = v_over ^ r_over;
      s = _mm256_mask_mov_epi16(s, v_over & ~r_over, above);
      s = _mm256_mask_mov_epi16(s, r_over & ~v_over, at_or_below);
      if (two_sided) {
        const __mmask16 v_under = _mm512_cmp_ps_mask(v, lo, _CMP_LT_OQ), r_under = _mm512_cmp_ps_mask(r, lo, _CMP_LT_OQ);
        moved |= v_under ^ r_under;
        s = _mm256_mask_mov_epi16(s, v_under & ~r_under, _mm256_or_si256(above, sign));
        s = _mm256_mask_mov_epi16(s, r_under & ~v_under, _mm256_or_si256(at_or_below, sign));
      }
      if (moved & lanes) _mm256_mask_storeu_epi16(out, moved & lanes, s);
    }
}

}  // namespace tilemoe::kernels
