#pragma once
// One table of kernel entry points per ISA, so the layers above pick an ISA once and then call
// through plain function pointers.
#include "amx/activation.hpp"
#include "amx/adamw.hpp"
#include "amx/combine_rows.hpp"
#include "amx/convert_bf16.hpp"
#include "amx/gemm_bf16.hpp"
#include "amx/gemm_int.hpp"
#include "amx/isa.hpp"
#include "amx/lora_grad.hpp"
#include "amx/lora_rows.hpp"
#include "amx/gemm_mxfp4.hpp"
#include "amx/pack_mxfp4.hpp"
#include "amx/pack_strided.hpp"
#include "amx/pack_transposed.hpp"

namespace tilemoe::kernels {

// Batches with fewer rows than this go to the AVX512-BF16 kernel in the AMX table. Measured on a
// 16-core AMX Xeon (K = 2048, N = 1408, 48 experts streamed from memory, 16 threads, GB/s of
// weights, two runs each): m = 1: AVX-512 128-149, AMX 131-163; m = 2: 119-166 vs 124-198;
// m = 4: 97-114 vs 112-170; m = 8: 60-80 vs 96-137. Up to 2 rows both stream at memory
// bandwidth, and the AVX-512 kernel needs no tile state (no configuration reload per call, no
// 8 KiB of extra context per thread); from 4 rows on the AVX-512 kernel falls behind (4 dot
// products per 64 weight bytes), while one TDPBF16PS takes 1 KiB of weights for up to 16 rows.
inline constexpr int kAmxMinRows = 4;
// int4 weights' integer GEMM takes the tiles from this many rows (kernel_table.cpp says why).
inline constexpr int kAmxMinRowsInt4 = 6;

struct KernelTable {
  Isa isa;
  GemmBf16Fn gemm_bf16;
  SiluMulBf16Fn silu_mul_bf16;
  SiluMulBackwardFn silu_mul_backward;
  KeepClampSidesFn keep_clamp_sides;  // the forward's saved gate and up under a swiglu_limit
  PackTransposedFn pack_transposed_kblock;  // backward: Wᵀ panels from the forward layout
  PackTransposedIntFn pack_transposed_kblock_int;  // backward through int8/int4 weights
  LoraGradOuterFn lora_grad_outer;          // backward: LoRA weight gradients
  LoraProjectRowsFn lora_project_rows;      // LoRA of experts with few rows, from the f32 factors
  LoraExpandRowsAddFn lora_expand_rows_add;
  PackStridedFn pack_strided;           // the per-call LoRA packing for the tile kernels
  ConvertToBf16Fn convert_to_bf16;
  CombineBf16RowsFn combine_bf16_rows;  // the forward's combine of a token's bf16 slot rows
  GemmIntFn gemm_int;              // int8/int4 weights (W8A8, W4A8)
  QuantizeRowsFn quantize_rows;    // activations to int8 per row for gemm_int
  DequantizeMxfp4Fn dequantize_mxfp4;  // MXFP4 weights into gemm_bf16's layout (gemm_mxfp4.hpp)
  GemmMxfp4RowsFn gemm_mxfp4_rows;     // MXFP4 weights' decode rows, dequantized in registers (null: decode
                                       // runs the dequantized chunks, as 5-15 rows do)
  GemmMxfp4FewRowsFn gemm_mxfp4_few_rows;  // MXFP4 weights for one row tile (null: no tiles)
  GemmMxfp4PairFirstBlockFn gemm_mxfp4_pair_first_block;  // and a pair's first 32 rows (null: no tiles)
  AdamWUpdateFn adamw_update;      // the optimizer step over the caller's LoRA arrays
  // Rows from which gemm_bf16 runs AMX tiles (smaller m goes to AVX-512); 0 when the table
  // has no AMX kernel.
  int amx_min_rows;
  // The panels a layer's GEMM item should cover for an expert of 4-15 rows. The AVX-512 kernels
  // block 4 rows x 4 panels per pass; an item of one panel leaves 3/4 of that block empty (one
  // thread, K = 2048, 12 rows, weights in L2: 130 against 300 GFLOP/s on Zen 5). On AMX, where
  // those rows run on tiles, 4 panels took the forward 4-6 % faster than 1 at 64 and 128 tokens
  // of DeepSeek-V2-Lite (cases taking turns in one process). (Decode's 1-3 rows have items of
  // their own width: the forward's kDecodeItemPanels, work_split.hpp.)
  int few_row_item_panels;
};

// Throws Error(unsupported) with the reason when `isa` cannot run on this machine.
const KernelTable& kernel_table(Isa isa);

// What gemm_mxfp4 runs with a table.
inline Mxfp4Kernels mxfp4_kernels(const KernelTable& kt) {
  return {kt.gemm_bf16, kt.dequantize_mxfp4, kt.gemm_mxfp4_rows, kt.gemm_mxfp4_few_rows, kt.gemm_mxfp4_pair_first_block};
}

}  // namespace tilemoe::kernels
