// The AVX-512 MXFP4 dequantization, bit for bit, and gemm_mxfp4 through the AVX512-BF16 kernels;
// SKIPPED without AVX512-BF16.
#include "kernel_mxfp4_test_grid.hpp"

using namespace tilemoe::kernels;

TEST_CASE("avx512 mxfp4 kernels match the definition") { test::check_mxfp4_kernels(Isa::avx512_bf16); }
