#pragma once
// The AdamW update kernel against a float64 evaluation of torch.optim.AdamW's formula, over
// awkward lengths (the masked tail), step numbers from the first to late ones, several
// hyperparameter sets, arrays ending at a guard page, and a NaN gradient that must stay in its
// element. Included by one test file per ISA.
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "amx/adamw.hpp"
#include "catch.hpp"
#include "kernel_test_grid.hpp"

namespace tilemoe::test {

struct AdamWHyper {
  double lr, beta1, beta2, eps, weight_decay;
};
inline const AdamWHyper kAdamWHypers[] = {{1e-3, 0.9, 0.999, 1e-8, 1e-2}, {0.5, 0.0, 0.5, 1e-3, 0.0}, {2e-4, 0.95, 0.9999, 0.0, 0.1}};

// The magnitudes of the terms summed into p and m: what a few float roundings are relative to
// (a result that cancels to near zero has no relative accuracy of its own).
struct AdamWTerms {
  double p, m;
};

// One element of the update in double: (p, m, v) after it.
inline AdamWTerms adamw_reference(const AdamWHyper& h, std::int64_t t, double g, double& p, double& m, double& v) {
  AdamWTerms terms{};
  p *= 1.0 - static_cast<double>(h.lr) * h.weight_decay;
  terms.m = std::abs(m) + (1.0 - h.beta1) * (std::abs(g) + std::abs(m));
  m += (1.0 - h.beta1) * (g - m);
  v = h.beta2 * v + (1.0 - h.beta2) * g * g;
  const double step_size = h.lr / (1.0 - std::pow(static_cast<double>(h.beta1), static_cast<double>(t)));
  const double denom = std::sqrt(v) / std::sqrt(1.0 - std::pow(static_cast<double>(h.beta2), static_cast<double>(t))) + h.eps;
  // m's own rounding error (relative to terms.m) goes through the step as well.
  terms.p = std::abs(p) + step_size * terms.m / denom;
  p -= step_size * m / denom;
  return terms;
}

inline void run_adamw_grid(kernels::AdamWUpdateFn update) {
  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (const AdamWHyper& h : kAdamWHypers)
    for (std::size_t n : {0, 1, 7, 15, 16, 17, 31, 33, 100, 1031})
      for (std::int64_t t : {1, 2, 10, 5000}) {
        INFO("lr " << h.lr << " betas " << h.beta1 << "," << h.beta2 << " eps " << h.eps << " wd " << h.weight_decay << " n " << n
                   << " step " << t);
        kernels::test::Guarded<float> p(n), g(n), m(n), v(n);
        std::vector<double> pd(n), md(n), vd(n);
        for (std::size_t i = 0; i < n; ++i) {
          p[i] = dist(rng);
          g[i] = i % 9 == 4 ? 0.0f : dist(rng) * 1e-2f;
          m[i] = t == 1 ? 0.0f : dist(rng) * 1e-2f;
          v[i] = t == 1 ? 0.0f : std::abs(dist(rng)) * 1e-4f;
          pd[i] = p[i], md[i] = m[i], vd[i] = v[i];
        }
        if (n > 3) g[3] = NAN;
        update(kernels::adamw_coefficients(h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, t), p.data(), g.data(), m.data(), v.data(), n);
        for (std::size_t i = 0; i < n; ++i) {
          const AdamWTerms terms = adamw_reference(h, t, g[i], pd[i], md[i], vd[i]);
          if (std::isnan(g[i])) {
            REQUIRE(std::isnan(p[i]));
            REQUIRE(std::isnan(m[i]));
            REQUIRE(std::isnan(v[i]));
            continue;
          }
          if (std::isnan(pd[i])) {  // eps 0 and a zero gradient at step 1: 0/0, as in PyTorch
            REQUIRE(std::isnan(p[i]));
            continue;
          }
          REQUIRE(std::abs(p[i] - pd[i]) <= 1e-6 * terms.p);
          REQUIRE(std::abs(m[i] - md[i]) <= 1e-6 * terms.m);
          REQUIRE(std::abs(v[i] - vd[i]) <= 1e-6 * (std::abs(vd[i]) + 1e-20));
        }
      }
}

// `update` against the portable update, bit for bit: every ISA keeps PyTorch's order of roundings.
inline void check_adamw_bits_as_portable(kernels::AdamWUpdateFn update) {
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (std::size_t n : {1, 16, 37, 4099}) {
    std::vector<float> g(n), p0(n), m0(n), v0(n);
    for (std::size_t i = 0; i < n; ++i) g[i] = dist(rng), p0[i] = dist(rng), m0[i] = dist(rng) * 1e-2f, v0[i] = std::abs(dist(rng)) * 1e-3f;
    std::vector<float> p1 = p0, m1 = m0, v1 = v0, p2 = p0, m2 = m0, v2 = v0;
    const auto c = kernels::adamw_coefficients(3e-3f, 0.9f, 0.999f, 1e-8f, 0.05f, 7);
    kernels::adamw_update_portable(c, p1.data(), g.data(), m1.data(), v1.data(), n);
    update(c, p2.data(), g.data(), m2.data(), v2.data(), n);
    INFO("n " << n);
    REQUIRE(std::memcmp(p1.data(), p2.data(), n * sizeof(float)) == 0);
    REQUIRE(std::memcmp(m1.data(), m2.data(), n * sizeof(float)) == 0);
    REQUIRE(std::memcmp(v1.data(), v2.data(), n * sizeof(float)) == 0);
  }
}

}  // namespace tilemoe::test
