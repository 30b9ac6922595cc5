// The avx2 table's MXFP4 path (the portable dequantization and decode rows, the bf16 kernels built for
// AVX2); SKIPPED without AVX2 + FMA + F16C.
#include "kernel_mxfp4_test_grid.hpp"

using namespace tilemoe::kernels;

TEST_CASE("avx2 mxfp4 kernels match the definition") { test::check_mxfp4_kernels(Isa::avx2); }
