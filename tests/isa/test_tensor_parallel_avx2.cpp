#include "tensor_parallel_grid.hpp"

using namespace tilemoe;

TEST_CASE("avx2 tensor-parallel layer equals the reference for 1 to 4 nodes", "[tp][avx2]") {
  test::run_tp_grid(kernels::Isa::avx2);
}
TEST_CASE("avx2 tensor-parallel layer matches the fixtures", "[tp][avx2][fixtures]") { test::run_tp_fixtures(kernels::Isa::avx2); }
TEST_CASE("avx2 tensor-parallel layer is bit-identical for any thread count", "[tp][avx2]") {
  test::run_tp_thread_identity(kernels::Isa::avx2, {1, 2, 5});
}
TEST_CASE("avx2 tensor-parallel layer: a shared gather gives the bits of per-node gathers", "[tp][avx2]") {
  test::run_tp_shared_gather_identity(kernels::Isa::avx2);
}
