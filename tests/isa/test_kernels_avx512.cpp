// The AVX512-BF16 kernels (decode GEMM, silu_mul); SKIPPED on CPUs without AVX512-BF16.
#include <cstring>
#include <random>
#include <vector>

#include "amx/kernel_table.hpp"
#include "kernel_test_grid.hpp"

using namespace tilemoe;
using namespace tilemoe::kernels;

TEST_CASE("avx512 kernels match the double reference") { test::check_kernels(Isa::avx512_bf16); }

// The AMX table's entry for few rows: the same products, with the weights asked for ahead.
TEST_CASE("the avx512 kernel that prefetches matches the double reference") {
  test::check_gemm_grid(gemm_bf16_avx512_prefetching);
  test::check_gemm_features(gemm_bf16_avx512_prefetching);
  test::check_gemm_large(gemm_bf16_avx512_prefetching);
  test::check_gemm_empty_k(gemm_bf16_avx512_prefetching);
}

// Asking for lines ahead must not change the arithmetic: both entries give the same bits.
TEST_CASE("the avx512 kernel's two entries give the same bits") {
  std::mt19937 rng(41);
  for (int m : {1, 2, 3, 5, 9}) {
    for (int k : {70, 4100}) {
      INFO("m " << m << " k " << k);
      const int n = 100;
      const PackedShape shape = packed_shape(n, k);
      std::vector<bf16> w(static_cast<std::size_t>(n) * k), a(static_cast<std::size_t>(m) * shape.k_padded, bf16{0});
      for (bf16& v : w) v = test::random_bf16(rng);
      for (int i = 0; i < m; ++i)
        for (int q = 0; q < k; ++q) a[static_cast<std::size_t>(i) * shape.k_padded + q] = test::random_bf16(rng);
      std::vector<bf16> packed(packed_bf16_elements(n, k));
      pack_bf16_weights(w.data(), n, k, static_cast<std::size_t>(k), packed.data());
      const std::size_t ldc = static_cast<std::size_t>(shape.panels) * kPanelColumns;
      std::vector<float> plain(static_cast<std::size_t>(m) * ldc, 1.0f), ahead = plain;
      GemmBf16Args g = gemm_args(a.data(), static_cast<std::size_t>(shape.k_padded), m, shape.k_padded, packed.data(), 0, shape.panels,
                                 plain.data(), ldc);
      g.accumulate = m % 2 == 1;
      gemm_bf16_avx512(g);
      g.c = ahead.data();
      gemm_bf16_avx512_prefetching(g);
      REQUIRE(std::memcmp(plain.data(), ahead.data(), plain.size() * sizeof(float)) == 0);
    }
  }
}

TEST_CASE("the avx512 table points at the avx512 kernels") {
  const KernelTable& t = kernel_table(Isa::avx512_bf16);
  CHECK(t.gemm_bf16 == &gemm_bf16_avx512);
  CHECK(t.silu_mul_bf16 == &silu_mul_bf16_avx512);
  CHECK(t.amx_min_rows == 0);
}
