#include "moe_forward_grid.hpp"

using namespace tilemoe;

TEST_CASE("avx512 forward equals the reference on the shape grid", "[forward][avx512]") {
  test::run_forward_grid(kernels::Isa::avx512_bf16);
}
TEST_CASE("avx512 forward matches the fixtures", "[forward][avx512][fixtures]") { test::run_fixture_forward(kernels::Isa::avx512_bf16); }
TEST_CASE("avx512 forward packs a held LoRA set once", "[forward][avx512][lora]") { test::run_held_lora(kernels::Isa::avx512_bf16); }
TEST_CASE("avx512 forward with ranks of their own for gate, up and down", "[forward][avx512][lora]") {
  test::run_forward_projection_ranks(kernels::Isa::avx512_bf16);
}
TEST_CASE("avx512 forward is bit-identical for any thread count", "[forward][avx512]") {
  test::run_thread_count_identity(kernels::Isa::avx512_bf16, {1, 2, 3, 16});
}
