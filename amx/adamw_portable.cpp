#include <cmath>

#include "amx/adamw.hpp"

namespace tilemoe::kernels {

AdamWCoefficients adamw_coefficients(double lr, double beta1, double beta2, double eps, double weight_decay, std::int64_t t) {
  const double bias1 = 1.0 - std::pow(beta1, static_cast<double>(t));
  const double bias2 = 1.0 - std::pow(beta2, static_cast<double>(t));
  AdamWCoefficients c{};
  c.decay = static_cast<float>(1.0 - lr * weight_decay);
  c.w1 = static_cast<float>(1.0 - beta1);
  c.beta2 = static_cast<float>(beta2);
  c.w2 = static_cast<float>(1.0 - beta2);
  c.neg_step = static_cast<float>(-(lr / bias1));
  c.bias2_sqrt = static_cast<float>(std::sqrt(bias2));
  c.eps = static_cast<float>(eps);
  return c;
}

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
