#pragma once
// BF16 GEMM micro-kernels over the packed layout (pack_bf16.hpp), one signature for every ISA:
//
//   C[i][j] (= or +=) sum_k A[i][k] * W[panel_begin*16 + j][k]
//                   + sum_q A2[i][q] * W2[panel_begin*16 + j][q]
//
// for rows i in [0, m) and the panels [panel_begin, panel_end), accumulated in f32. The second
// product is optional (LoRA: A2 = scaled x·Aᵀ, W2 = LoRA B) and lands in the same accumulators.
// Kernels are pure: no heap allocation, no threads; callers split panels and rows over threads.
//
// Contract (not checked in the kernels, which are the hot path):
//  - A has m rows at stride lda >= k_padded; each row has k_padded readable elements and zeros
//    in [k, k_padded). Rows >= m are never read. No alignment is required. With a_tiles, A is
//    in tile order instead (pack_rows_as_tiles, pack_bf16.hpp) and lda is ignored; the second
//    product's A2 is always by rows.
//  - packed_b is the whole packed matrix with k_padded == PackedShape::k_padded; only panels
//    [panel_begin, panel_end) are read; panel_end > panel_begin (any count, odd too).
//  - When packed_b2 != nullptr and k2_padded > 0: the same rules hold for a2/lda2/k2_padded/
//    packed_b2, which must have the same panel count as packed_b. packed_b2's panels lie
//    b2_panel_stride elements apart, or k2_padded * 16 (whole k-blocks) when it is 0; the short
//    panel form (compact_panel_elements, pack_bf16.hpp) is read as whole blocks too, so that A2
//    must then be zero in the columns past the panel's own k-pairs, and the next panel's values
//    (or the form's trailing zeros) finite.
//  - C column 0 is column 0 of panel panel_begin; C has (panel_end - panel_begin)*16 columns,
//    ldc >= that. Only rows < m and those columns are written.
#include <cstddef>

#include "amx/pack_bf16.hpp"
#include "tilemoe/bf16.hpp"

namespace tilemoe::kernels {

struct GemmBf16Args {
  const bf16* a;
  std::size_t lda;
  int m;
  int k_padded;  // multiple of 32 (0 allowed: the product is then zero)
  const bf16* packed_b;
  int panel_begin, panel_end;
  const bf16* a2 = nullptr;
  std::size_t lda2 = 0;
  int k2_padded = 0;
  const bf16* packed_b2 = nullptr;
  std::size_t b2_panel_stride = 0;  // 0: k2_padded * kPanelColumns
  float* c;
  std::size_t ldc;
  bool accumulate = false;  // false: C = ...; true: C += ...
  bool a_tiles = false;     // A in tile order: see the contract above
};

// Where rows [row0, row0 + r) of the first product's A start, with the element strides from one
// row to the next and from one k-block to the next. In tile order the r rows must lie in one row
// tile (row0 % 16 + r <= 16).
struct ARows {
  const bf16* p;
  std::size_t row_stride, kblock_stride;
};
inline ARows a_rows(const GemmBf16Args& g, int row0) {
  if (!g.a_tiles) return {g.a + static_cast<std::size_t>(row0) * g.lda, g.lda, kBlockK};
  const std::size_t tile_elements = static_cast<std::size_t>(g.k_padded) * kATileRows;
  return {g.a + static_cast<std::size_t>(row0 / kATileRows) * tile_elements + static_cast<std::size_t>(row0 % kATileRows) * kBlockK,
          kBlockK, kBlockElements};
}

// Elements between consecutive panels of a second product's packed_b2 (see the contract above).
inline std::size_t second_panel_stride(int k2_padded, std::size_t b2_panel_stride) {
  return b2_panel_stride != 0 ? b2_panel_stride : static_cast<std::size_t>(k2_padded) * kPanelColumns;
}

using GemmBf16Fn = void (*)(const GemmBf16Args&);

// The arguments of a plain product C = A Wᵀ over panels [panel_begin, panel_end); the second
// product and accumulate are left off.
inline GemmBf16Args gemm_args(const bf16* a, std::size_t lda, int m, int k_padded, const bf16* packed_b, int panel_begin,
                              int panel_end, float* c, std::size_t ldc) {
  GemmBf16Args g{};
  g.a = a;
  g.lda = lda;
  g.m = m;
  g.k_padded = k_padded;
  g.packed_b = packed_b;
  g.panel_begin = panel_begin;
  g.panel_end = panel_end;
  g.c = c;
  g.ldc = ldc;
  return g;
}

void gemm_bf16_portable(const GemmBf16Args& args);
// AVX2, the portable kernel's blocking and bits (gemm_bf16_avx2.cpp); only where isa_available(Isa::avx2).
void gemm_bf16_avx2(const GemmBf16Args& args);
void gemm_bf16_avx512(const GemmBf16Args& args);  // only where isa_available(Isa::avx512_bf16)
// The same, asking for the weights some lines ahead of the loads (software prefetch): faster where
// the hardware prefetchers keep too few lines in flight (the AMX Xeons), slower on Zen 4.
void gemm_bf16_avx512_prefetching(const GemmBf16Args& args);
// Only where isa_available(Isa::amx_bf16). A is re-read for every pair of panels, so a call's
// A (m × k_padded bf16) should fit in L2 next to 512 KiB of weights: split larger m over calls
// (e.g. m <= 256 at K = 2048).
void gemm_bf16_amx(const GemmBf16Args& args);

// Returns this thread's AMX tile registers to their initial state. A thread that keeps tiles
// configured carries 8 KiB of extra state through every context switch and can keep its core
// out of deep C-states, so a worker should call this when it runs out of AMX work (e.g. before
// it sleeps). The next gemm_bf16_amx call configures the tiles again. Only where AMX is available.
void release_amx_tiles();

}  // namespace tilemoe::kernels
