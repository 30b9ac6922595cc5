#include "tensor_parallel_grid.hpp"

using namespace tilemoe;

TEST_CASE("amx tensor-parallel layer equals the reference for 1 to 4 nodes", "[tp][amx]") {
  test::run_tp_grid(kernels::Isa::amx_bf16);
}
TEST_CASE("amx tensor-parallel layer matches the fixtures", "[tp][amx][fixtures]") { test::run_tp_fixtures(kernels::Isa::amx_bf16); }
TEST_CASE("amx tensor-parallel layer is bit-identical for any thread count", "[tp][amx]") {
  test::run_tp_thread_identity(kernels::Isa::amx_bf16, {1, 2, 16});
}
TEST_CASE("amx tensor-parallel layer: a shared gather gives the bits of per-node gathers", "[tp][amx]") {
  test::run_tp_shared_gather_identity(kernels::Isa::amx_bf16);
}
