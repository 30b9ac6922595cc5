// The backward's AVX2 kernels, checked like the portable ones and against them (the repack bit
// for bit, the outer products within tolerance); SKIPPED on CPUs without AVX2 + FMA + F16C.
#include "kernel_backward_grid.hpp"

using namespace tilemoe::kernels;

TEST_CASE("avx2 backward kernels match W, the double reference and the portable kernels") {
  const test::BackwardKernels portable{pack_transposed_kblock_portable, lora_grad_outer_portable, gemm_bf16_portable};
  test::check_backward_kernels({pack_transposed_kblock_avx2, lora_grad_outer_avx2, gemm_bf16_avx2}, &portable);
}
