#include "moe_backward_quantized_grid.hpp"

using namespace tilemoe;

TEST_CASE("int weights transposed for backward equal the bf16 repack of their dequantized values", "[backward][quantized]") {
  test::check_transposed_int_matches_bf16();
}
TEST_CASE("portable fine-tuning through int8/int4 base weights equals the reference on the dequantized weights",
          "[backward][quantized][portable]") {
  test::run_quantized_backward_grid(kernels::Isa::portable);
}
