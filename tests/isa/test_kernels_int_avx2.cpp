// The portable integer kernels compiled for AVX2 + FMA + F16C (the avx2 table); SKIPPED on CPUs
// without them.
#include "kernel_int_test_grid.hpp"

using namespace tilemoe::kernels;

TEST_CASE("avx2 int kernels match the exact reference") { test::check_int_kernels(Isa::avx2); }
