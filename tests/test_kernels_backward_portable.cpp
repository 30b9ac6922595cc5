// The backward's portable kernels: transposed repack and LoRA gradient outer products.
#include "kernel_backward_grid.hpp"

using namespace tilemoe::kernels;

TEST_CASE("portable backward kernels match W and the double reference") {
  test::check_backward_kernels({pack_transposed_kblock_portable, lora_grad_outer_portable, gemm_bf16_portable}, nullptr);
}
