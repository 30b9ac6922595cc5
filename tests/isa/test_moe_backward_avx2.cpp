#include "moe_backward_grid.hpp"

using namespace tilemoe;

TEST_CASE("avx2 backward equals the reference on the shape grid", "[backward][avx2]") {
  test::run_backward_grid(kernels::Isa::avx2);
}
TEST_CASE("avx2 backward matches the fixtures", "[backward][avx2][fixtures]") {
  test::run_fixture_backward(kernels::Isa::avx2);
}
TEST_CASE("avx2 backward is bit-identical for 1, 2 and 3 threads", "[backward][avx2]") {
  test::run_backward_thread_identity(kernels::Isa::avx2, {1, 2, 3});
}
TEST_CASE("avx2 backward with a Wᵀ weight copy gives the bits of the repacking one", "[backward][avx2]") {
  test::run_backward_weight_copy_identity(kernels::Isa::avx2);
}
TEST_CASE("avx2 backward with other ranks for gate, up and down", "[backward][avx2]") {
  test::run_backward_projection_ranks(kernels::Isa::avx2);
}
