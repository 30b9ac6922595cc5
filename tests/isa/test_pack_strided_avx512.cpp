#include "pack_strided_grid.hpp"

using namespace tilemoe;

TEST_CASE("pack_strided_f32 with the AVX-512 conversion equals the element-by-element packer", "[kernels][pack][avx512]") {
  test::run_pack_strided_grid(kernels::convert_to_bf16_avx512);
}
