// AdamW on AVX-512: 16 parameters a step, the portable version's operations in the same order
// (no fused multiply-adds), so both give the same bits. The update streams 28 bytes a parameter;
// the sqrt and divide stay well under that memory time.
#include "amx/immintrin_gcc12.hpp"

#include "amx/adamw.hpp"
#include "amx/bf16_avx512.hpp"

namespace tilemoe::kernels {
namespace {

inline void update16(const AdamWCoefficients& c, float* p, const float* g, float* m, float* v, __mmask16 k) {
  const __m512 gi = _mm512_maskz_loadu_ps(k, g);
  const __m512 mi0 = _mm512_maskz_loadu_ps(k, m);
  const __m512 pi = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, p), _mm512_set1_ps(c.decay));
  const __m512 mi = _mm512_add_ps(mi0, _mm512_mul_ps(_mm512_set1_ps(c.w1), _mm512_sub_ps(gi, mi0)));
  const __m512 vi = _mm512_add_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(k, v), _mm512_set1_ps(c.beta2)),
                                  _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(c.w2), gi), gi));
  const __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(vi), _mm512_set1_ps(c.bias2_sqrt)), _mm512_set1_ps(c.eps));
  _mm512_mask_storeu_ps(m, k, mi);
  _mm512_mask_storeu_ps(v, k, vi);
  _mm512_mask_storeu_ps(p, k, _mm512_add_ps(pi, _mm512_div_ps(_mm512_mul_ps(_mm512_set1_ps(c.neg_step), mi), denom)));
}

}  // namespace

void adamw_update_avx512(const AdamWCoefficients& c, float* p, const float* g, float* m, float* v, std::size_t n) {
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) update16(c, p + i, g + i, m + i, v + i, 0xffff);
  if (i < n) update16(c, p + i, g + i, m + i, v + i, lanes16(n - i));
}

}  // namespace tilemoe::kernels
