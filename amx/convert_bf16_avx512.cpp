#include "amx/immintrin_gcc12.hpp"

#include "amx/bf16_avx512.hpp"
#include "amx/convert_bf16.hpp"

namespace tilemoe::kernels {

void convert_to_bf16_avx512(const float* src, std::size_t n, float scale, bf16* dst) {
  const __m512 s = _mm512_set1_ps(scale);
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), to_bf16(_mm512_mul_ps(s, _mm512_loadu_ps(src + i))));
  if (i < n) {
    const __mmask16 mask = lanes16(n - i);
    _mm256_mask_storeu_epi16(dst + i, mask, to_bf16(_mm512_mul_ps(s, _mm512_maskz_loadu_ps(mask, src + i))));
  }
}

}  // namespace tilemoe::kernels
