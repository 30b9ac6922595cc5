#pragma once
// The packed layout (pack_bf16.hpp) of Wᵀ, built on the fly from the forward-packed W.
//
// The backward multiplies by W itself, C[m][K] = A[m][N] · W[N][K]: a GEMM whose "weight" is Wᵀ
// (K outputs, N reduction). Rather than keep a second packed copy of every weight matrix, the
// caller repacks the two Wᵀ panels it is about to use (32 of W's k-columns: one forward k-block)
// into a small buffer and runs the ordinary GEMM kernels on it.
//
// Wᵀ packed by the same rules has panels over K and k-blocks over N (padded to 32):
//   block (q', j)[r*32 + c*2 + p] = Wᵀ[q'*16 + c][j*32 + 2r + p] = W[j*32 + 2r + p][q'*16 + c]
#include <cstddef>
#include <cstring>

#include "amx/pack_bf16.hpp"
#include "tilemoe/bf16.hpp"

namespace tilemoe::kernels {

// k-blocks of the transposed layout: the forward padded N to 16, the transposed needs 32.
inline int transposed_kblocks(int panels) { return (panels + 1) / 2; }

// Writes the two Wᵀ panels that hold W's k-block kb (Wᵀ panels 2kb and 2kb+1), every one of their
// transposed_kblocks(panels) k-blocks: panel q (0 or 1), k-block j goes to
//   dst + q * dst_panel_stride + j * kBlockElements
// with element [r*32 + c*2 + p] = W[j*32 + 2r + p][kb*32 + q*16 + c], and zero where
// j*32 + 2r + p >= panels*16 (an odd panel count leaves half of the last k-block zero).
//
// packed_w: the whole forward-packed W (panels × kblocks blocks); 0 <= kb < kblocks.
// dst_panel_stride >= transposed_kblocks(panels) * kBlockElements (elements); it lets a caller
// stack several matrices along the reduction (e.g. gate then up in one buffer: the up call writes
// at dst + transposed_kblocks(panels_gate) * kBlockElements with the same stride). Nothing between
// the panels is written. Pure: no allocation, no threads.
using PackTransposedFn = void (*)(const bf16* packed_w, int panels, int kblocks, int kb, bf16* dst,
                                  std::size_t dst_panel_stride);

void pack_transposed_kblock_portable(const bf16* packed_w, int panels, int kblocks, int kb, bf16* dst,
                                     std::size_t dst_panel_stride);
// Only where isa_available(Isa::avx2). The same bits as the portable version.
void pack_transposed_kblock_avx2(const bf16* packed_w, int panels, int kblocks, int kb, bf16* dst,
                                 std::size_t dst_panel_stride);
// Only where isa_available(Isa::avx512_bf16) (it needs AVX512-F/BW).
void pack_transposed_kblock_avx512(const bf16* packed_w, int panels, int kblocks, int kb, bf16* dst,
                                   std::size_t dst_panel_stride);

// The vector repacks' walk over one call's blocks: for each Wᵀ k-block j and each of W's panels
// nb = 2j + b (b = 0, 1) in it, transpose_panel(nb, o0, o1) writes W's panel nb's two halves of
// the forward block (k-pairs 0..7 and 8..15) as the 8 rows at o0 (Wᵀ panel 0) and o1 (panel 1).
// The second halves of the last k-block are zero at an odd panel count.
template <class TransposePanel>
inline void walk_transposed_kblock(int panels, bf16* dst, std::size_t dst_panel_stride, TransposePanel&& transpose_panel) {
  constexpr int kHalf = kBlockElements / 2;
  const int tkblocks = transposed_kblocks(panels);
  for (int j = 0; j < tkblocks; ++j) {
    bf16* out0 = dst + static_cast<std::size_t>(j) * kBlockElements;
    bf16* out1 = out0 + dst_panel_stride;
    transpose_panel(2 * j, out0, out1);
    if (2 * j + 1 < panels) {
      transpose_panel(2 * j + 1, out0 + kHalf, out1 + kHalf);
    } else {
      std::memset(static_cast<void*>(out0 + kHalf), 0, kHalf * sizeof(bf16));
      std::memset(static_cast<void*>(out1 + kHalf), 0, kHalf * sizeof(bf16));
    }
  }
}

}  // namespace tilemoe::kernels

#include "amx/pack_int.hpp"
#include "amx/prefetch.hpp"

namespace tilemoe::kernels {

// The same two Wᵀ panels for W held as int8/int4 codes (pack_int.hpp), dequantized on the way
// (code × its group's scale, rounded to bf16): training through a frozen quantized base reads
// the quantized weights themselves, one k-block at a time, never a bf16 copy of the matrix.
// Only W's panels [nb0, nb1) are taken (they play the role of `panels` above, starting at W's
// row nb0 * 16); kb counts 32-wide k-blocks of W's columns (kb * 32 < s.k_padded).
using PackTransposedIntFn = void (*)(const PackedIntShape& s, const PackedIntView& w, int nb0, int nb1, int kb, bf16* dst,
                                     std::size_t dst_panel_stride);
void pack_transposed_kblock_int_portable(const PackedIntShape& s, const PackedIntView& w, int nb0, int nb1, int kb, bf16* dst,
                                         std::size_t dst_panel_stride);
// Only where isa_available(Isa::avx2). The same bits as the portable version.
void pack_transposed_kblock_int_avx2(const PackedIntShape& s, const PackedIntView& w, int nb0, int nb1, int kb, bf16* dst,
                                     std::size_t dst_panel_stride);
// Only where isa_available(Isa::avx512_bf16). The same bits as the portable version.
void pack_transposed_kblock_int_avx512(const PackedIntShape& s, const PackedIntView& w, int nb0, int nb1, int kb, bf16* dst,
                                       std::size_t dst_panel_stride);

// For the vector repacks: asks for the codes that the next call (k-block kb + 1) reads from W's
// panels [nb_first, nb_last) into L2. A call reads kBlockK codes of every panel, the panels a
// panel's bytes apart (a new page each time, where the hardware prefetchers start over), and the
// next call the kBlockK codes after them: asked for here, they no longer wait on memory one by one.
// A panel's codes are in k order (kIntBlockK-blocks of k-quad rows), so k-block kb + 1 starts
// (kb + 1) * kBlockK * 16 * bits / 8 bytes into the panel.
inline void prefetch_next_kblock_int(const PackedIntShape& s, const PackedIntView& w, int nb_first, int nb_last, int kb) {
  if ((kb + 1) * kBlockK >= s.k_padded) return;
  const std::size_t kb_bytes = static_cast<std::size_t>(kBlockK) * kPanelColumns * s.bits / 8;
  for (int nb = nb_first; nb < nb_last; ++nb)
    prefetch_range_l2(w.codes + static_cast<std::size_t>(nb) * s.panel_bytes() + (kb + 1) * kb_bytes, kb_bytes);
}

// The vector repacks' walk over one call's blocks: for each Wᵀ panel q (W columns kk0 .. kk0 +
// 15) and each Wᵀ k-block j (W panels nb0 + 2j and nb0 + 2j + 1), pack_panel_rows(nb, kk0, out)
// writes the 8 block rows (32 bf16 each) that W's panel nb gives, at out. The second half of the
// last k-block is zero at an odd panel count. The next call's codes are asked for on the way.
template <class PackPanelRows>
inline void walk_transposed_int_kblock(const PackedIntShape& s, const PackedIntView& w, int nb0, int nb1, int kb, bf16* dst,
                                       std::size_t dst_panel_stride, PackPanelRows&& pack_panel_rows) {
  const int tkblocks = transposed_kblocks(nb1 - nb0);
  for (int q = 0; q < 2; ++q) {
    const int kk0 = kb * kBlockK + q * kPanelColumns;
    for (int j = 0; j < tkblocks; ++j) {
      const int nb = nb0 + 2 * j;
      if (q == 0) prefetch_next_kblock_int(s, w, nb, nb + 2 < nb1 ? nb + 2 : nb1, kb);
      bf16* out = dst + q * dst_panel_stride + static_cast<std::size_t>(j) * kBlockElements;
      pack_panel_rows(nb, kk0, out);
      if (nb + 1 < nb1)
        pack_panel_rows(nb + 1, kk0, out + kBlockElements / 2);
      else
        std::memset(static_cast<void*>(out + kBlockElements / 2), 0, kBlockElements / 2 * sizeof(bf16));
    }
  }
}

}  // namespace tilemoe::kernels
