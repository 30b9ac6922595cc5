#include <immintrin.h>

#include "amx/peak_probe.hpp"

namespace tilemoe::kernels {

double peak_flops_avx2(std::int64_t iterations) {
  // The avx2 kernels multiply and add apart (no FMA: the portable bits), so that is what is timed:
  // a multiply and an add per multiply-add, twelve independent add chains.
  __m256 acc[12];
  for (auto& a : acc) a = _mm256_setzero_ps();
  const __m256 x = _mm256_set1_ps(1.0f), y = _mm256_set1_ps(1e-30f);
  for (std::int64_t i = 0; i < iterations; ++i)
    for (auto& a : acc) a = _mm256_add_ps(a, _mm256_mul_ps(x, y));
  __m256 sum = acc[0];
  for (int i = 1; i < 12; ++i) sum = _mm256_add_ps(sum, acc[i]);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, sum);
  volatile float keep = lanes[0];
  (void)keep;
  return static_cast<double>(iterations) * 12 * 8 * 2;
}

}  // namespace tilemoe::kernels
