#include "amx/kernel_table.hpp"

#include <string>

#include "tilemoe/error.hpp"

namespace tilemoe::kernels {
namespace {

// The AMX Xeons' few rows go to the AVX-512 kernels that prefetch: their hardware prefetchers
// alone keep too few lines of the weight streams in flight (gemm_bf16_avx512.cpp).
void gemm_bf16_amx_or_avx512(const GemmBf16Args& args) {
  if (args.m < kAmxMinRows) {
    gemm_bf16_avx512_prefetching(args);
  } else {
    gemm_bf16_amx(args);
  }
}

// The same split for integer weights; int4 at group 32 has no tile kernel unless its scales
// decompose into column scales (a 64-k tile spans two scale groups), so it stays on AVX512-VNNI.
// int4 goes to the tiles from kAmxMinRowsInt4: below that, unpacking its codes for the tiles and
// rescaling C at every scale group cost more than VNNI's products. On the device (DeepSeek-V3's
// shape, group 128, held LoRA r=16, thresholds as cases taking turns in one process, both orders)
// 64 and 128 tokens (about 2 and 4 rows an expert) ran 3.5-7 % faster with 6 than with 4, 256
// tokens alike; 8 did as well as 6, and 12 was 14 % slower at 256 tokens. DeepSeek-V2-Lite at 128
// tokens (about 12 rows) ran alike with 4 and 6.
void gemm_int_amx_or_avx512(const GemmIntArgs& args) {
  const bool multiples = args.b.column_scales != nullptr && args.b.group_multiples != nullptr;
  const int min_rows = args.shape.bits == 4 ? kAmxMinRowsInt4 : kAmxMinRows;
  if (args.m < min_rows || (args.shape.group % kIntBlockK != 0 && !multiples)) {
    gemm_int_avx512_prefetching(args);
  } else {
    gemm_int_amx(args);
  }
}

constexpr KernelTable kPortable{Isa::portable,          gemm_bf16_portable,
                                silu_mul_bf16_portable,  silu_mul_backward_portable, keep_clamp_sides_portable,
                                pack_transposed_kblock_portable, pack_transposed_kblock_int_portable,
                                lora_grad_outer_portable, lora_project_rows_portable, lora_expand_rows_add_portable,
                                pack_strided_portable,
                                convert_to_bf16_portable, combine_bf16_rows_portable, gemm_int_portable,
                                quantize_rows_portable,  dequantize_mxfp4_blocks_portable, gemm_mxfp4_rows_portable, nullptr, nullptr, adamw_update_portable, 0, 1};
// AVX2: the kernels with files of their own (*_avx2.cpp: the GEMMs, the backward's repacks, MXFP4),
// the other portable kernels compiled a second time for AVX2 (CMakeLists.txt); the packing entries
// not among them stay the portable ones. Every entry gives the portable entry's bits but the MXFP4
// rows kernel, which rounds activations as gemm_mxfp4.hpp allows (as AVX-512's does).
constexpr KernelTable kAvx2{Isa::avx2,              gemm_bf16_avx2,
                            silu_mul_bf16_avx2,     silu_mul_backward_avx2, keep_clamp_sides_avx2,
                            pack_transposed_kblock_avx2, pack_transposed_kblock_int_avx2,
                            lora_grad_outer_avx2,   lora_project_rows_avx2, lora_expand_rows_add_avx2,
                            pack_strided_portable,
                            convert_to_bf16_avx2,   combine_bf16_rows_avx2, gemm_int_avx2,
                            quantize_rows_avx2,     dequantize_mxfp4_blocks_avx2, gemm_mxfp4_rows_avx2, nullptr, nullptr, adamw_update_avx2, 0, 1};
constexpr KernelTable kAvx512{Isa::avx512_bf16,       gemm_bf16_avx512,
                              silu_mul_bf16_avx512,   silu_mul_backward_avx512, keep_clamp_sides_avx512,
                              pack_transposed_kblock_avx512, pack_transposed_kblock_int_avx512,
                              lora_grad_outer_avx512, lora_project_rows_avx512, lora_expand_rows_add_avx512,
                              pack_strided_avx512,
                              convert_to_bf16_avx512, combine_bf16_rows_avx512, gemm_int_avx512,
                              quantize_rows_avx512,   dequantize_mxfp4_blocks_avx512, gemm_mxfp4_rows_avx512, nullptr, nullptr, adamw_update_avx512, 0, 4};
constexpr KernelTable kAmx{Isa::amx_bf16,         gemm_bf16_amx_or_avx512,
                           silu_mul_bf16_avx512, silu_mul_backward_avx512, keep_clamp_sides_avx512,
                           pack_transposed_kblock_avx512, pack_transposed_kblock_int_avx512,
                           lora_grad_outer_amx, lora_project_rows_avx512, lora_expand_rows_add_avx512,
                           pack_strided_avx512,
                           convert_to_bf16_avx512, combine_bf16_rows_avx512, gemm_int_amx_or_avx512,
                           quantize_rows_avx512, dequantize_mxfp4_blocks_avx512, gemm_mxfp4_rows_avx512, gemm_mxfp4_few_rows_amx, gemm_mxfp4_pair_first_block_amx, adamw_update_avx512, kAmxMinRows, 4};

}  // namespace

const KernelTable& kernel_table(Isa isa) {
  std::string reason = isa_unavailable_reason(isa);
  if (!reason.empty()) {
    fail(ErrorKind::unsupported, std::string("kernel_table(") + isa_name(isa) + "): " + reason);
  }
  switch (isa) {
    case Isa::portable: return kPortable;
    case Isa::avx2: return kAvx2;
    case Isa::avx512_bf16: return kAvx512;
    case Isa::amx_bf16: return kAmx;
  }
  fail(ErrorKind::invalid_argument, "kernel_table: unknown ISA");
}

}  // namespace tilemoe::kernels
