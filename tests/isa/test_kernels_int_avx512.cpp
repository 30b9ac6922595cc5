// The AVX512-VNNI integer kernels; SKIPPED on CPUs without AVX512-BF16 (which all have VNNI).
#include "kernel_int_test_grid.hpp"

using namespace tilemoe::kernels;

TEST_CASE("avx512 int kernels match the exact reference") { test::check_int_kernels(Isa::avx512_bf16); }

// The AMX table's entry for few rows and int4 at group 32: the same products, codes asked for ahead.
TEST_CASE("the avx512 int kernel that prefetches matches the exact reference") {
  test::check_int_gemm_grid(gemm_int_avx512_prefetching, false);
  test::check_int_gemm_large(gemm_int_avx512_prefetching, false);
}
