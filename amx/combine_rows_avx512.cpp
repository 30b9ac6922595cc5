#include "amx/immintrin_gcc12.hpp"

#include "amx/bf16_avx512.hpp"
#include "amx/combine_rows.hpp"

namespace tilemoe::kernels {

namespace {

inline __m512 load_bf16(const bf16* p) { return bf16_to_f32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
inline __m512 load_bf16(const bf16* p, __mmask16 m) { return bf16_to_f32(_mm256_maskz_loadu_epi16(m, p)); }

}  // namespace

// 64 columns at a time in registers across all the rows: out is written once, never read.
void combine_bf16_rows_avx512(const bf16* const* rows, const float* weights, int count, std::size_t width, float* out) {
  std::size_t c = 0;
  for (; c + 64 <= width; c += 64) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int j = 0; j < count; ++j) {
      const __m512 w = _mm512_set1_ps(weights ? weights[j] : 1.0f);
      const bf16* y = rows[j] + c;
      a0 = _mm512_fmadd_ps(w, load_bf16(y), a0);
      a1 = _mm512_fmadd_ps(w, load_bf16(y + 16), a1);
      a2 = _mm512_fmadd_ps(w, load_bf16(y + 32), a2);
      a3 = _mm512_fmadd_ps(w, load_bf16(y + 48), a3);
    }
    _mm512_storeu_ps(out + c, a0);
    _mm512_storeu_ps(out + c + 16, a1);
    _mm512_storeu_ps(out + c + 32, a2);
    _mm512_storeu_ps(out + c + 48, a3);
  }
  for (; c < width; c += 16) {
    const std::size_t left = width - c;
    const __mmask16 m = lanes16(left);
    __m512 a = _mm512_setzero_ps();
    for (int j = 0; j < count; ++j) a = _mm512_fmadd_ps(_mm512_set1_ps(weights ? weights[j] : 1.0f), load_bf16(rows[j] + c, m), a);
    _mm512_mask_storeu_ps(out + c, m, a);
  }
}

}  // namespace tilemoe::kernels
