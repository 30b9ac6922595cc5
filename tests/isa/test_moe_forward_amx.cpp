#include "moe_forward_grid.hpp"

using namespace tilemoe;

TEST_CASE("amx forward equals the reference on the shape grid", "[forward][amx]") { test::run_forward_grid(kernels::Isa::amx_bf16); }
TEST_CASE("amx forward matches the fixtures", "[forward][amx][fixtures]") { test::run_fixture_forward(kernels::Isa::amx_bf16); }
TEST_CASE("amx forward packs a held LoRA set once", "[forward][amx][lora]") { test::run_held_lora(kernels::Isa::amx_bf16); }
TEST_CASE("amx forward with ranks of their own for gate, up and down", "[forward][amx][lora]") {
  test::run_forward_projection_ranks(kernels::Isa::amx_bf16);
}
TEST_CASE("amx forward is bit-identical for 1, 2 and 16 threads", "[forward][amx]") {
  test::run_thread_count_identity(kernels::Isa::amx_bf16, {1, 2, 16});
}
