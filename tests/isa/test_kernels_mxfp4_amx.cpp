// gemm_mxfp4 through the AMX table's bf16 kernel (tiles from 4 rows) and the raw AMX kernel;
// SKIPPED without AMX.
#include "kernel_mxfp4_test_grid.hpp"

using namespace tilemoe::kernels;

TEST_CASE("amx mxfp4 kernels match the definition") { test::check_mxfp4_kernels(Isa::amx_bf16); }
