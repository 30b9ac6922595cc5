#include <immintrin.h>

#include "amx/peak_probe.hpp"

namespace tilemoe::kernels {

double peak_flops_avx512(std::int64_t iterations) {
  __m512 acc[12];
  for (auto& a : acc) a = _mm512_setzero_ps();
  __m512bh x = (__m512bh)_mm512_set1_epi16(0x3f80), y = (__m512bh)_mm512_set1_epi16(0x0001);
  // Twelve chains cover VDPBF16PS latency x throughput on current cores.
  for (std::int64_t i = 0; i < iterations; ++i)
    for (auto& a : acc) a = _mm512_dpbf16_ps(a, x, y);
  __m512 sum = acc[0];
  for (int i = 1; i < 12; ++i) sum = _mm512_add_ps(sum, acc[i]);
  // A plain store, not _mm512_reduce_add_ps: GCC 12's header for it warns of an uninitialised value.
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, sum);
  volatile float keep = lanes[0];
  (void)keep;
  return static_cast<double>(iterations) * 12 * 16 * 2 * 2;
}

}  // namespace tilemoe::kernels
