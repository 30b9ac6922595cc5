#include "adamw_grid.hpp"

using namespace tilemoe;

TEST_CASE("the AVX-512 AdamW update equals torch.optim.AdamW's formula in float64", "[kernels][adamw][avx512]") {
  test::run_adamw_grid(kernels::adamw_update_avx512);
}

TEST_CASE("the AVX-512 AdamW update gives the portable version's bits", "[kernels][adamw][avx512]") {
  test::check_adamw_bits_as_portable(kernels::adamw_update_avx512);
}
