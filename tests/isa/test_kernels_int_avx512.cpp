// The AVX512-VNNI integer kernels; SKIPPED on CPUs without AVX512-BF16 (which all have VNNI).
#include <cstring>
#include <random>
#include <vector>

#include "kernel_int_test_grid.hpp"

using namespace tilemoe::kernels;

TEST_CASE("avx512 int kernels match the exact reference") { test::check_int_kernels(Isa::avx512_bf16); }

// The AMX table's entry for few rows and int4 at group 32: the same products, codes asked for ahead.
TEST_CASE("the avx512 int kernel that prefetches matches the exact reference") {
  test::check_int_gemm_grid(gemm_int_avx512_prefetching, false);
  test::check_int_gemm_large(gemm_int_avx512_prefetching, false);
}

// Asking for lines ahead must not change the arithmetic: both entries give the same bits.
TEST_CASE("the avx512 int kernel's two entries give the same bits") {
  std::mt19937 rng(43);
  for (int bits : {8, 4})
    for (int m : {1, 2, 3, 5}) {
      INFO("bits " << bits << " m " << m);
      const int n = 70, k = 4100;
      test::IntWeights w(rng, bits, n, k, 128);
      const PackedIntShape& s = w.shape;
      std::vector<std::int8_t> a(static_cast<std::size_t>(m) * s.k_padded, 0);
      for (int i = 0; i < m; ++i)
        for (int q = 0; q < k; ++q)
          a[static_cast<std::size_t>(i) * s.k_padded + q] = static_cast<std::int8_t>(std::uniform_int_distribution<int>(-127, 127)(rng));
      std::vector<float> a_scale(static_cast<std::size_t>(m), 0.01f);
      const std::size_t ldc = static_cast<std::size_t>(s.panels) * 16;
      std::vector<float> plain(static_cast<std::size_t>(m) * ldc, 1.0f), ahead = plain;
      GemmIntArgs g{};
      g.a = a.data();
      g.lda = static_cast<std::size_t>(s.k_padded);
      g.m = m;
      g.a_scale = a_scale.data();
      g.shape = s;
      g.b = w.view(w.codes.data());
      g.panel_begin = 0;
      g.panel_end = s.panels;
      g.c = plain.data();
      g.ldc = ldc;
      g.accumulate = m % 2 == 1;
      gemm_int_avx512(g);
      g.c = ahead.data();
      gemm_int_avx512_prefetching(g);
      REQUIRE(std::memcmp(plain.data(), ahead.data(), plain.size() * sizeof(float)) == 0);
    }
}
