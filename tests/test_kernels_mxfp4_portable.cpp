// The portable MXFP4 dequantization (the definition the AVX-512 one is held to) and gemm_mxfp4
// through the portable bf16 kernel.
#include "kernel_mxfp4_test_grid.hpp"

using namespace tilemoe::kernels;

TEST_CASE("portable mxfp4 kernels match the definition") { test::check_mxfp4_kernels(Isa::portable); }
