// The forward with int8/int4 base weights on the avx2 kernels; SKIPPED where the CPU lacks them.
#include "moe_forward_quantized_grid.hpp"

using namespace tilemoe;

TEST_CASE("avx2 int8/int4 forward equals the reference on dequantized weights", "[forward][quantized]") {
  test::run_quantized_forward_grid(kernels::Isa::avx2);
}
TEST_CASE("avx2 int8/int4 forward matches the fixtures", "[forward][quantized][fixtures]") {
  test::run_quantized_fixture_forward(kernels::Isa::avx2);
}
TEST_CASE("avx2 int8/int4 forward with ranks of their own for gate, up and down", "[forward][quantized][lora]") {
  test::run_quantized_projection_ranks(kernels::Isa::avx2);
}
TEST_CASE("avx2 int8/int4 forward packs a held LoRA set once", "[forward][quantized][lora]") {
  test::run_quantized_held_lora(kernels::Isa::avx2);
}
TEST_CASE("avx2 int8/int4 forward: same bits for 1, 2 and 16 threads, NaN stays in its token", "[forward][quantized]") {
  test::run_quantized_identity_and_nan(kernels::Isa::avx2, {1, 2, 16});
}
TEST_CASE("avx2 quantization error on Gaussian weights is within the bars", "[forward][quantized]") {
  test::run_quantization_error(kernels::Isa::avx2);
}
