// The AVX512-VNNI integer kernels; SKIPPED on CPUs without AVX512-BF16 (which all have VNNI).
#include "kernel_int_test_grid.hpp"

using namespace tilemoe::kernels;

TEST_CASE("avx512 int kernels match the exact reference") { test::check_int_kernels(Isa::avx512_bf16); }
