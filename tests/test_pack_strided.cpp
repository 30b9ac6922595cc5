#include "pack_strided_grid.hpp"

using namespace tilemoe;

TEST_CASE("pack_strided_f32 with the portable conversion equals the element-by-element packer", "[kernels][pack]") {
  test::run_pack_strided_grid(kernels::convert_to_bf16_portable);
}
