#pragma once
// Integer GEMM micro-kernels over the packed int8/int4 layout (pack_int.hpp), one signature for
// every ISA: with per-row activation codes a (int8) and scales sa,
//
//   C[i][j] (= or +=) sa[i] * sum_g scale[g][j] * sum_{k in group g} a[i][k] * Q[j][k]
//
// for rows i in [0, m) and the panels [panel_begin, panel_end). Products of codes are exact in
// int32 (|a|, |Q| <= 127 and K < 2^17 keep every sum in range); scales apply once per group.
// Pure kernels, as the bf16 ones: no allocation beyond a fixed stack or thread-local scratch, no
// threads.
//
// Contract (not checked here, the hot path):
//  - a has m rows at stride lda >= k_padded, each with k_padded readable codes, zeros in
//    [k, k_padded); or, with a_tiles, m rows in tile order (pack_int.hpp; lda unused), the rows
//    past m in the last row tile readable but never used. a_scale has m entries (NaN makes that
//    row's outputs NaN).
//  - b is the whole packed matrix of shape `shape`; only panels [panel_begin, panel_end) are read.
//  - C column 0 is column 0 of panel panel_begin; C has (panel_end - panel_begin)*16 columns.
//  - Optional bf16 result: with y set (and not accumulate), the result rounded to bf16 (nearest even,
//    NaN stays NaN, as convert_bf16.hpp) goes to y, rows ldy apart, column 0 at C's column 0 (whole
//    panels: ldy >= (panel_end - panel_begin) * 16); C is then scratch of C's shape whose contents are
//    unspecified.
//  - Optional second product in bf16 (a LoRA term stays bf16 on every weight type), with
//    GemmBf16Args's rules for a2/lda2/k2_padded/packed_b2/b2_panel_stride: C also gets
//    + A2 · W2ᵀ over the same panels, W2 having the same panel count as b.
#include <cstddef>
#include <cstdint>

#include "amx/convert_bf16.hpp"
#include "amx/gemm_bf16.hpp"
#include "amx/pack_int.hpp"

namespace tilemoe::kernels {

struct GemmIntArgs {
  const std::int8_t* a;
  std::size_t lda;
  int m;
  const float* a_scale;
  PackedIntShape shape;
  PackedIntView b;
  int panel_begin, panel_end;
  float* c;
  std::size_t ldc;
  bool accumulate = false;
  bool a_tiles = false;
  const bf16* a2 = nullptr;
  std::size_t lda2 = 0;
  int k2_padded = 0;
  const bf16* packed_b2 = nullptr;
  std::size_t b2_panel_stride = 0;  // 0: k2_padded * kPanelColumns
  // The result in bf16 (see the contract above): down's C goes straight into the rows of y that
  // the combine reads, without a pass of its own over an f32 C.
  bf16* y = nullptr;
  std::size_t ldy = 0;

  bool has_second() const { return packed_b2 != nullptr && k2_padded > 0; }
};

// C's rows as bf16 into y, for the kernels that compute C in f32 first (nothing without y).
void write_int_result_bf16(const GemmIntArgs& args, ConvertToBf16Fn convert);

// The second product of `args`, added to its C by the bf16 kernel `gemm` (an empty main product,
// accumulating): for the integer kernels that do not fuse it.
void add_second_product(const GemmIntArgs& args, GemmBf16Fn gemm);

// The rows of a tile-order A as rows, in a per-thread buffer: for the kernels that read rows.
GemmIntArgs with_int_a_rows(const GemmIntArgs& args);

using GemmIntFn = void (*)(const GemmIntArgs&);

void gemm_int_portable(const GemmIntArgs& args);
// AVX2 (VPMADDUBSW), the portable kernel's bits; only where isa_available(Isa::avx2).
void gemm_int_avx2(const GemmIntArgs& args);
void gemm_int_avx512(const GemmIntArgs& args);  // AVX512-VNNI; only where isa_available(Isa::avx512_bf16)
// The same, asking for the codes some lines ahead of the loads (gemm_bf16_avx512_prefetching).
void gemm_int_avx512_prefetching(const GemmIntArgs& args);
// Only where isa_available(Isa::amx_bf16). Groups must be multiples of 64 (int8 always is; int4
// at group 32 goes to gemm_int_avx512 in the kernel table).
void gemm_int_amx(const GemmIntArgs& args);

// Per-row int8 quantization of activations: scale = max|x| / 127 (0 for a zero row, NaN for a
// row with NaN or Inf), codes round-to-nearest-even(x / scale); codes in [k, k_padded) are 0.
using QuantizeRowsFn = void (*)(const std::uint16_t* x, std::size_t ldx, int rows, int k, int k_padded, std::int8_t* codes,
                                std::size_t ldq, float* scales);
void quantize_rows_portable(const std::uint16_t* x, std::size_t ldx, int rows, int k, int k_padded, std::int8_t* codes,
                            std::size_t ldq, float* scales);
// The portable kernel compiled for AVX2 + FMA + F16C; only where isa_available(Isa::avx2).
void quantize_rows_avx2(const std::uint16_t* x, std::size_t ldx, int rows, int k, int k_padded, std::int8_t* codes,
                        std::size_t ldq, float* scales);
void quantize_rows_avx512(const std::uint16_t* x, std::size_t ldx, int rows, int k, int k_padded, std::int8_t* codes,
                          std::size_t ldq, float* scales);

}  // namespace tilemoe::kernels
