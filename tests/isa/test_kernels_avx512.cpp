// The AVX512-BF16 kernels (decode GEMM, silu_mul); SKIPPED on CPUs without AVX512-BF16.
#include "amx/kernel_table.hpp"
#include "kernel_test_grid.hpp"

using namespace tilemoe::kernels;

TEST_CASE("avx512 kernels match the double reference") { test::check_kernels(Isa::avx512_bf16); }

// The AMX table's entry for few rows: the same products, with the weights asked for ahead.
TEST_CASE("the avx512 kernel that prefetches matches the double reference") {
  test::check_gemm_grid(gemm_bf16_avx512_prefetching);
  test::check_gemm_features(gemm_bf16_avx512_prefetching);
  test::check_gemm_large(gemm_bf16_avx512_prefetching);
  test::check_gemm_empty_k(gemm_bf16_avx512_prefetching);
}

TEST_CASE("the avx512 table points at the avx512 kernels") {
  const KernelTable& t = kernel_table(Isa::avx512_bf16);
  CHECK(t.gemm_bf16 == &gemm_bf16_avx512);
  CHECK(t.silu_mul_bf16 == &silu_mul_bf16_avx512);
  CHECK(t.amx_min_rows == 0);
}
