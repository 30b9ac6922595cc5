#include "moe_forward_grid.hpp"

using namespace tilemoe;

TEST_CASE("avx2 forward equals the reference on the shape grid", "[forward][avx2]") {
  test::run_forward_grid(kernels::Isa::avx2);
}
TEST_CASE("avx2 forward matches the fixtures", "[forward][avx2][fixtures]") { test::run_fixture_forward(kernels::Isa::avx2); }
TEST_CASE("avx2 forward packs a held LoRA set once", "[forward][avx2][lora]") { test::run_held_lora(kernels::Isa::avx2); }
TEST_CASE("avx2 forward with ranks of their own for gate, up and down", "[forward][avx2][lora]") {
  test::run_forward_projection_ranks(kernels::Isa::avx2);
}
TEST_CASE("avx2 forward is bit-identical for any thread count", "[forward][avx2]") {
  test::run_thread_count_identity(kernels::Isa::avx2, {1, 2, 3, 16});
}
