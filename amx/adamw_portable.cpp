#include <cmath>

#include "amx/adamw.hpp"

namespace tilemoe::kernels {

void adamw_update_portable(const AdamWCoefficients& c, float* p, const float* g, float* m, float* v, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    // One rounding per operation, in PyTorch's order, as in the AVX-512 version (CMakeLists.txt
    // turns FMA contraction off for both files).
    const float gi = g[i];
    const float pi = p[i] * c.decay;
    const float mi = m[i] + c.w1 * (gi - m[i]);
    const float vi = v[i] * c.beta2 + (c.w2 * gi) * gi;
    const float denom = std::sqrt(vi) / c.bias2_sqrt + c.eps;
    m[i] = mi;
    v[i] = vi;
    p[i] = pi + (c.neg_step * mi) / denom;
  }
}

}  // namespace tilemoe::kernels
