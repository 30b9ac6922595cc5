// The portable integer kernels (int8/int4 weights, int8 activations): the definition the
// AVX512-VNNI and AMX-INT8 kernels are checked against.
#include "kernel_int_test_grid.hpp"

using namespace tilemoe::kernels;

TEST_CASE("portable int kernels match the exact reference") { test::check_int_kernels(Isa::portable); }
