#pragma once
// One table of kernel entry points per ISA, so the layers above pick an ISA once and then call
// through plain function pointers.
#include "amx/activation.hpp"
#include "amx/gemm_bf16.hpp"
#include "amx/isa.hpp"

namespace tilemoe::kernels {

// Batches with fewer rows than this go to the AVX512-BF16 kernel in the AMX table. Below 8 rows
// the AVX-512 kernel reads each weight byte once per <= 4 rows and does <= 8 dot products per
// 64 weight bytes, which keeps it at memory bandwidth (decode is memory bound either way),
// without AMX's tile (re)configuration and mostly empty 16-row tiles. From 8 rows up it turns
// compute bound, while one TDPBF16PS consumes 1 KiB of weights for up to 16 rows.
inline constexpr int kAmxMinRows = 8;

struct KernelTable {
  Isa isa;
  GemmBf16Fn gemm_bf16;
  SiluMulBf16Fn silu_mul_bf16;
  // Rows from which gemm_bf16 runs AMX tiles (smaller m goes to AVX-512); 0 when the table
  // has no AMX kernel.
  int amx_min_rows;
};

// Throws Error(unsupported) with the reason when `isa` cannot run on this machine.
const KernelTable& kernel_table(Isa isa);

}  // namespace tilemoe::kernels
