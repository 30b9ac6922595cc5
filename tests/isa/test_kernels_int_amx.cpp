// The AMX-INT8 integer kernels (and the table's split to AVX512-VNNI for few rows and int4 at
// group 32); SKIPPED without AMX.
#include "kernel_int_test_grid.hpp"

using namespace tilemoe::kernels;

TEST_CASE("amx int kernels match the exact reference") { test::check_int_kernels(Isa::amx_bf16); }
