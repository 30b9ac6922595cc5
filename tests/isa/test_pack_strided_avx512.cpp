#include "pack_strided_grid.hpp"

using namespace tilemoe;

TEST_CASE("the AVX-512 pack_strided equals the element-by-element packer", "[kernels][pack][avx512]") {
  test::run_pack_strided_grid(kernels::pack_strided_avx512);
}
