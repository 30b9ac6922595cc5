#include "moe_backward_quantized_grid.hpp"

using namespace tilemoe;

TEST_CASE("avx512 fine-tuning through int8/int4 base weights equals the reference on the dequantized weights", "[backward][quantized][avx512]") {
  test::run_quantized_backward_grid(kernels::Isa::avx512_bf16);
}
