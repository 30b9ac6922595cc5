// The portable bf16 kernels compiled for AVX2 + FMA + F16C (the avx2 table); SKIPPED on CPUs
// without them.
#include <cstring>
#include <random>
#include <vector>

#include "amx/kernel_table.hpp"
#include "amx/pack_bf16.hpp"
#include "kernel_test_grid.hpp"

using namespace tilemoe;
using namespace tilemoe::kernels;

TEST_CASE("avx2 kernels match the double reference") { test::check_kernels(Isa::avx2); }

// Built with -ffp-contract=off from the same sources, the avx2 product rounds as the portable one
// does: the same bits, which the layer's bit-for-bit promises across factor dtypes rest on.
TEST_CASE("the avx2 bf16 product gives the portable product's bits") {
  std::mt19937 rng(73);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (int m : {1, 3, 4, 7, 33}) {
    for (int k : {31, 70, 2050}) {
      const int n = 45;
      INFO("m " << m << " k " << k);
      const PackedShape shape = packed_shape(n, k);
      std::vector<bf16> w(static_cast<std::size_t>(n) * k), a(static_cast<std::size_t>(m) * shape.k_padded, bf16{0});
      for (auto& v : w) v = float_to_bf16(dist(rng));
      for (int i = 0; i < m; ++i)
        for (int q = 0; q < k; ++q) a[static_cast<std::size_t>(i) * shape.k_padded + q] = float_to_bf16(dist(rng));
      std::vector<bf16> packed(packed_bf16_elements(n, k));
      pack_bf16_weights(w.data(), n, k, static_cast<std::size_t>(k), packed.data());
      const std::size_t ldc = static_cast<std::size_t>(shape.n_padded);
      std::vector<float> portable(static_cast<std::size_t>(m) * ldc), avx2(portable.size());
      gemm_bf16_portable(gemm_args(a.data(), shape.k_padded, m, shape.k_padded, packed.data(), 0, shape.panels, portable.data(), ldc));
      gemm_bf16_avx2(gemm_args(a.data(), shape.k_padded, m, shape.k_padded, packed.data(), 0, shape.panels, avx2.data(), ldc));
      REQUIRE(std::memcmp(portable.data(), avx2.data(), portable.size() * sizeof(float)) == 0);
    }
  }
}
