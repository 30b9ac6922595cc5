#include "moe_backward_quantized_grid.hpp"

using namespace tilemoe;

TEST_CASE("amx fine-tuning through int8/int4 base weights equals the reference on the dequantized weights", "[backward][quantized][amx]") {
  test::run_quantized_backward_grid(kernels::Isa::amx_bf16);
}
