// The forward with int8/int4 base weights on the portable kernels; AVX512-VNNI and AMX-INT8 have
// their own files in tests/isa/ that report SKIPPED where the CPU lacks them.
#include "moe_forward_quantized_grid.hpp"

using namespace tilemoe;

TEST_CASE("portable int8/int4 forward equals the reference on dequantized weights", "[forward][quantized][portable]") {
  test::run_quantized_forward_grid(kernels::Isa::portable);
}
TEST_CASE("portable int8/int4 forward matches the fixtures", "[forward][quantized][portable][fixtures]") {
  test::run_quantized_fixture_forward(kernels::Isa::portable);
}
TEST_CASE("portable int8/int4 forward with ranks of their own for gate, up and down", "[forward][quantized][lora]") {
  test::run_quantized_projection_ranks(kernels::Isa::portable);
}
TEST_CASE("portable int8/int4 forward packs a held LoRA set once", "[forward][quantized][lora]") {
  test::run_quantized_held_lora(kernels::Isa::portable);
}
TEST_CASE("portable int8/int4 forward: same bits for any thread count, NaN stays in its token", "[forward][quantized][portable]") {
  test::run_quantized_identity_and_nan(kernels::Isa::portable, {1, 2, 3});
}
TEST_CASE("quantization error on Gaussian weights is within the bars", "[forward][quantized]") {
  test::run_quantization_error(kernels::Isa::portable);
}
