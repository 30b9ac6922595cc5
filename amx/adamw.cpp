// The update's coefficients, shared by every ISA's adamw_update (the *_portable files are compiled
// twice, for baseline x86-64 and for AVX2, so what both need lives here).
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

}  // namespace tilemoe::kernels
