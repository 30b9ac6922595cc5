#include <cmath>

#include "amx/activation.hpp"

namespace tilemoe::kernels {

void silu_mul_bf16_portable(const float* gate, std::size_t ldg, const float* up, std::size_t ldu, int m, int n,
                            bf16* h, std::size_t ldh) {
  for (int i = 0; i < m; ++i) {
    const float* gi = gate + i * ldg;
    const float* ui = up + i * ldu;
    bf16* hi = h + i * ldh;
    for (int j = 0; j < n; ++j) {
      const float g = gi[j];
      // -inf / (1 + inf) would be NaN; the limit is -0.
      const float s = g == -INFINITY ? -0.0f : g / (1.0f + std::exp(-g));
      hi[j] = float_to_bf16(s * ui[j]);
    }
  }
}

}  // namespace tilemoe::kernels
