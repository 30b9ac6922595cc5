#include "adamw_grid.hpp"

using namespace tilemoe;

TEST_CASE("the portable AdamW update equals torch.optim.AdamW's formula in float64", "[kernels][adamw]") {
  test::run_adamw_grid(kernels::adamw_update_portable);
}
