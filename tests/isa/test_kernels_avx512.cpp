// The AVX512-BF16 kernels (decode GEMM, silu_mul); SKIPPED on CPUs without AVX512-BF16.
#include "amx/kernel_table.hpp"
#include "kernel_test_grid.hpp"

using namespace tilemoe::kernels;

TEST_CASE("avx512 kernels match the double reference") { test::check_kernels(Isa::avx512_bf16); }

TEST_CASE("the avx512 table points at the avx512 kernels") {
  const KernelTable& t = kernel_table(Isa::avx512_bf16);
  CHECK(t.gemm_bf16 == &gemm_bf16_avx512);
  CHECK(t.silu_mul_bf16 == &silu_mul_bf16_avx512);
  CHECK(t.amx_min_rows == 0);
}
