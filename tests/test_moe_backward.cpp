// The fast backward on the portable kernels (every x86-64 runs them); AVX512 and AMX have their
// own files in tests/isa/ that report SKIPPED where the CPU lacks them.
#include "moe_backward_grid.hpp"

using namespace tilemoe;

TEST_CASE("portable backward equals the reference on the shape grid", "[backward][portable]") {
  test::run_backward_grid(kernels::Isa::portable);
}
TEST_CASE("portable backward matches the fixtures", "[backward][portable][fixtures]") {
  test::run_fixture_backward(kernels::Isa::portable);
}
TEST_CASE("portable backward is bit-identical for 1, 2 and 3 threads", "[backward][portable]") {
  test::run_backward_thread_identity(kernels::Isa::portable, {1, 2, 3});
}
TEST_CASE("portable backward with a Wᵀ weight copy gives the bits of the repacking one", "[backward][portable]") {
  test::run_backward_weight_copy_identity(kernels::Isa::portable);
}
TEST_CASE("portable backward with other ranks for gate, up and down", "[backward][portable]") {
  test::run_backward_projection_ranks(kernels::Isa::portable);
}
