#include "moe_backward_quantized_grid.hpp"

using namespace tilemoe;

TEST_CASE("avx2 fine-tuning through int8/int4 base weights equals the reference on the dequantized weights", "[backward][quantized][avx2]") {
  test::run_quantized_backward_grid(kernels::Isa::avx2);
}
TEST_CASE("avx2 transposed repack of int weights equals the bf16 repack of their dequantized values", "[backward][quantized][avx2]") {
  test::check_transposed_int_matches_bf16(kernels::pack_transposed_kblock_int_avx2);
}
TEST_CASE("avx2 transposed repack of int weights gives the portable bits for non-finite and huge scales", "[backward][quantized][avx2]") {
  test::check_transposed_int_nonfinite_scales(kernels::pack_transposed_kblock_int_avx2);
}
