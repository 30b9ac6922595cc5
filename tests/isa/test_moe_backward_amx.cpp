#include "moe_backward_grid.hpp"

using namespace tilemoe;

TEST_CASE("amx backward equals the reference on the shape grid", "[backward][amx]") { test::run_backward_grid(kernels::Isa::amx_bf16); }
TEST_CASE("amx backward matches the fixtures", "[backward][amx][fixtures]") { test::run_fixture_backward(kernels::Isa::amx_bf16); }
TEST_CASE("amx backward is bit-identical for 1, 2 and 16 threads", "[backward][amx]") {
  test::run_backward_thread_identity(kernels::Isa::amx_bf16, {1, 2, 16});
}
TEST_CASE("amx backward with a Wᵀ weight copy gives the bits of the repacking one", "[backward][amx]") {
  test::run_backward_weight_copy_identity(kernels::Isa::amx_bf16);
}
TEST_CASE("amx backward with other ranks for gate, up and down", "[backward][amx]") {
  test::run_backward_projection_ranks(kernels::Isa::amx_bf16);
}
