// The portable integer kernels (int8/int4 weights, int8 activations): the definition the
// AVX512-VNNI and AMX-INT8 kernels are checked against.
#include "expect_error.hpp"
#include "kernel_int_test_grid.hpp"

using namespace tilemoe::kernels;

TEST_CASE("portable int kernels match the exact reference") { test::check_int_kernels(Isa::portable); }

// Integer sums over all of K are int32: an input size past kIntMaxK is refused, not wrapped.
TEST_CASE("integer weights refuse an input size whose sums could overflow") {
  CHECK(packed_int_shape(8, 16, kIntMaxK, 0).k_padded == kIntMaxK);
  CHECK(packed_int_shape(4, 16, kIntMaxK, 128).groups == kIntMaxK / 128);
  for (int bits : {8, 4})
    tilemoe::test::expect_error([&] { packed_int_shape(bits, 16, kIntMaxK + 1, 128); }, tilemoe::ErrorKind::invalid_argument, "131073");
}
