// The avx2 table's MXFP4 path (its own dequantization, no decode rows kernel: decode runs the
// dequantized chunks through the avx2 bf16 kernel; the portable rows kernel beside the avx2 ones is
// checked too); SKIPPED without AVX2 + FMA + F16C.
#include "kernel_mxfp4_test_grid.hpp"

using namespace tilemoe::kernels;

TEST_CASE("avx2 mxfp4 kernels match the definition") { test::check_mxfp4_kernels(Isa::avx2); }
