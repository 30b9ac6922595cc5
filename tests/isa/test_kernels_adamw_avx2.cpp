#include <cstring>

#include "adamw_grid.hpp"

using namespace tilemoe;

TEST_CASE("the AVX2 AdamW update equals torch.optim.AdamW's formula in float64", "[kernels][adamw][avx2]") {
  test::run_adamw_grid(kernels::adamw_update_avx2);
}

TEST_CASE("the AVX2 AdamW update gives the portable version's bits", "[kernels][adamw][avx2]") {
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (std::size_t n : {1, 16, 37, 4099}) {
    std::vector<float> g(n), p0(n), m0(n), v0(n);
    for (std::size_t i = 0; i < n; ++i) g[i] = dist(rng), p0[i] = dist(rng), m0[i] = dist(rng) * 1e-2f, v0[i] = std::abs(dist(rng)) * 1e-3f;
    std::vector<float> p1 = p0, m1 = m0, v1 = v0, p2 = p0, m2 = m0, v2 = v0;
    const auto c = kernels::adamw_coefficients(3e-3f, 0.9f, 0.999f, 1e-8f, 0.05f, 7);
    kernels::adamw_update_portable(c, p1.data(), g.data(), m1.data(), v1.data(), n);
    kernels::adamw_update_avx2(c, p2.data(), g.data(), m2.data(), v2.data(), n);
    INFO("n " << n);
    REQUIRE(std::memcmp(p1.data(), p2.data(), n * sizeof(float)) == 0);
    REQUIRE(std::memcmp(m1.data(), m2.data(), n * sizeof(float)) == 0);
    REQUIRE(std::memcmp(v1.data(), v2.data(), n * sizeof(float)) == 0);
  }
}
