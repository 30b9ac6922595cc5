#include "pack_strided_grid.hpp"

using namespace tilemoe;

TEST_CASE("the portable pack_strided equals the element-by-element packer", "[kernels][pack]") {
  test::run_pack_strided_grid(kernels::pack_strided_portable);
}
