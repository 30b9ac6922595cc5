#pragma once
// The one packed weight layout that the AMX, AVX512-BF16 and portable GEMM kernels all read.
//
// For W[N][K] (Y = X·Wᵀ; N outputs, K reduction), N is padded with zero rows to a multiple of
// 16 (a panel: 16 output columns) and K with zeros to a multiple of 32 (a k-block). Each
// (panel nb, k-block kb) block is 16 rows × 32 bf16 = 1 KiB in VNNI order:
//
//   packed[((nb*kblocks + kb)*16 + r)*32 + c*2 + p] = W[nb*16 + c][kb*32 + 2*r + p]
//   (r: k-pair 0..15, c: column 0..15, p: 0..1)
//
// so a block is exactly one AMX B tile (16 rows of 64 bytes) and one of its rows is one zmm for
// _mm512_dpbf16_ps. A panel's k-blocks are contiguous so a panel streams in order along K.
//
// Activations (the A operand, m rows × k_padded) may also be given in tile order: rows in groups
// of 16 (a row tile), each (row tile t, k-block kb) a contiguous 1 KiB block of 16 rows × 32 bf16:
//
//   tiles[((t*kblocks + kb)*16 + i)*32 + q] = A[t*16 + i][kb*32 + q]
//
// An AMX A tile is then one contiguous 1 KiB read instead of 16 lines at the row stride (which,
// at a stride of 4 KiB, all fall in one L1 set).
#include <cstddef>

#include "tilemoe/bf16.hpp"

namespace tilemoe::kernels {

inline constexpr int kPanelColumns = 16;
inline constexpr int kBlockK = 32;
inline constexpr int kBlockElements = kPanelColumns * kBlockK;  // 512 bf16 = 1 KiB

struct PackedShape {
  int n, k, n_padded, k_padded, panels, kblocks;
};

PackedShape packed_shape(int n, int k);  // throws Error(invalid_argument) for negative sizes
std::size_t packed_bf16_elements(int n, int k);  // n_padded * k_padded

// `packed` must hold packed_bf16_elements(n, k) elements; every one of them is written.
void pack_bf16_weights(const bf16* w, int n, int k, std::size_t ldw, bf16* packed);
// The short panel form of a packed matrix whose K ends at most 16 past a k-block boundary
// (k % 32 in (0, 16]: a LoRA factor of rank 16, say): each panel keeps only the k-pairs it has in
// its last k-block, half a block, so the next panel starts 512 bytes earlier. A kernel reading a
// whole last block then reads the next panel's first pairs (or the trailing zeros) as well; the
// second product's A2 is zero in those columns, so they add 0 (the values must be finite).
// Other K keep whole blocks (compact_panel_elements returns the packed panel's length).
std::size_t compact_panel_elements(int k);
// Elements of the short panel form of an n × k matrix, the trailing half block of zeros included.
std::size_t compact_packed_elements(int n, int k);
// Copies a packed n × k matrix (pack_bf16_weights' layout) into that form.
void compact_packed_panels(const bf16* packed, int n, int k, bf16* compact);
// Rounds to nearest even (tilemoe::float_to_bf16).
void pack_f32_weights_to_bf16(const float* w, int n, int k, std::size_t ldw, bf16* packed);
// The inverse of pack_bf16_weights (padding dropped), for tests and debugging.
void unpack_bf16_weights(const bf16* packed, int n, int k, bf16* w, std::size_t ldw);

inline constexpr int kATileRows = 16;

// Elements of an m-row A in tile order: m rounded up to whole row tiles, times k_padded.
std::size_t tiled_rows_elements(int m, int k_padded);
// Copies rows [0, m) of A (stride lda >= k_padded, k_padded a multiple of 32) into tile order.
// The rows past m in the last row tile are left unwritten: no kernel reads them.
void pack_rows_as_tiles(const bf16* a, std::size_t lda, int m, int k_padded, bf16* tiles);

// The inverse: rows [0, m) of an A in tile order back to rows at stride lda >= k_padded.
void unpack_tiles_to_rows(const bf16* tiles, int m, int k_padded, bf16* a, std::size_t lda);

// Row i's 32 elements of k-block kb in an A held in tile order (row length k_padded).
inline bf16* tile_row(bf16* tiles, int k_padded, int i, int kb) {
  const std::size_t kblocks = static_cast<std::size_t>(k_padded / kBlockK);
  return tiles + ((static_cast<std::size_t>(i / kATileRows) * kblocks + kb) * kATileRows + i % kATileRows) * kBlockK;
}

// Writes one row tile of an A in tile order: rows [0, count) (count <= 16) from src[r], n
// contiguous elements each, zeros in [n, k_padded); `tile` is the row tile's first block. The
// blocks are written in address order; rows [count, 16) are left unwritten.
void store_row_tile(const bf16* const* src, int count, int n, int k_padded, bf16* tile);

// Block (nb, kb) of the packed layout of W[n][k], at out, from `load(col, kk)` as below; zero
// where it pads the matrix.
template <typename Load>
void pack_block_with(int n, int k, int nb, int kb, bf16* out, Load& load) {
  for (int r = 0; r < kBlockK / 2; ++r) {
    const int kk = kb * kBlockK + 2 * r;
    for (int c = 0; c < kPanelColumns; ++c) {
      const int col = nb * kPanelColumns + c;
      const bool in_n = col < n;
      *out++ = (in_n && kk < k) ? load(col, kk) : bf16{0};
      *out++ = (in_n && kk + 1 < k) ? load(col, kk + 1) : bf16{0};
    }
  }
}

// Packs W[n][k] given element by element: `load(col, kk)` returns W[col][kk] as bf16 and is
// called only inside the unpadded matrix. For factors read in another orientation or pieced
// together from several arrays (the LoRA terms of the backward). Walks the packed layout in
// storage order, so writes are sequential.
template <typename Load>
void pack_weights_with(int n, int k, bf16* packed, Load load) {
  const PackedShape s = packed_shape(n, k);
  bf16* out = packed;
  for (int nb = 0; nb < s.panels; ++nb)
    for (int kb = 0; kb < s.kblocks; ++kb, out += kBlockElements) pack_block_with(n, k, nb, kb, out, load);
}

}  // namespace tilemoe::kernels
