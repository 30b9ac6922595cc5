#pragma once
// The packed layout of int8 and int4 weights that the AMX-INT8, AVX512-VNNI and portable integer
// GEMM kernels all read (the integer twin of pack_bf16.hpp).
//
// For codes Q[N][K] (Y = X·Wᵀ, W = Q * scale), N is padded to a multiple of 16 (a panel) and K
// to a multiple of 64 (a k-block), both with code 0. Each (panel nb, k-block kb) block holds
// 16 quads of k × 16 columns in VNNI order,
//
//   element (r, c, p) = Q[nb*16 + c][kb*64 + 4*r + p]   (r: k-quad 0..15, c: column, p: 0..3)
//
//   int8: byte r*64 + c*4 + p: 1 KiB, exactly one AMX INT8 B tile, a row of which is one zmm for
//         VPDPBUSD;
//   int4: 512 bytes; byte (r/2)*64 + c*4 + p holds quad-row r in its low nibble when r is even
//         and in its high nibble when r is odd, as code + 8 (0..15), so one 64-byte load and a
//         mask or a shift gives two VNNI rows.
// A panel's k-blocks are contiguous, so a panel streams in order along K.
//
// Scales: one f32 per (panel, group of `group` k, column) at scales[(nb*groups + g)*16 + c]; int8
// has a single group spanning all of K (one scale per output channel). colsums holds, at the
// same index, the sum of the group's codes: the AVX512-VNNI kernel multiplies unsigned bytes by
// signed ones, so it feeds activations as a + 128 and takes 128 * colsum back off.
#include <cstddef>
#include <cstdint>

#include "tilemoe/config.hpp"

namespace tilemoe::kernels {

inline constexpr int kIntBlockK = 64;
// The largest input size (K) of integer weights: the kernels' int32 sums stay exact up to it.
inline constexpr int kIntMaxK = 1 << 17;

struct PackedIntShape {
  int bits = 8;  // 8 or 4
  int n = 0, k = 0, n_padded = 0, k_padded = 0, panels = 0, kblocks = 0;
  int group = 0;   // k per scale: k_padded for int8; 32, 64 or 128 for int4
  int groups = 0;  // scale groups per column: ceil(k_padded / group)

  std::size_t block_bytes() const { return bits == 8 ? 1024 : 512; }
  std::size_t panel_bytes() const { return block_bytes() * static_cast<std::size_t>(kblocks); }
  std::size_t code_bytes() const { return panel_bytes() * static_cast<std::size_t>(panels); }
  std::size_t scale_count() const { return static_cast<std::size_t>(panels) * groups * 16; }
};

// bits 8 (group ignored) or 4 (group 32, 64 or 128); throws Error(invalid_argument) otherwise.
PackedIntShape packed_int_shape(int bits, int n, int k, int group);

// One packed matrix: where the kernels read it.
struct PackedIntView {
  const std::uint8_t* codes = nullptr;  // code_bytes()
  const float* scales = nullptr;        // scale_count()
  const std::int32_t* colsums = nullptr;
  // int4 only, optional (both or neither): the group scales as integer multiples of one scale per
  // column (decompose_int4_scales). The AMX kernel then turns codes into int8 (code * multiple)
  // and sums all of K in int32 with one scaling per output, as int8 weights do, instead of
  // scaling every group's sums.
  const float* column_scales = nullptr;         // panels * 16, at nb*16 + c
  const std::uint8_t* group_multiples = nullptr;  // scale_count(), at the scales' index
};

// The largest group multiple: code * multiple stays in int8 (-8 * 16 = -128, 7 * 16 = 112), and
// (code + 8) * multiple <= 240 fits a byte, which the AMX unpack relies on.
inline constexpr int kInt4MaxGroupMultiple = 16;

// For int4: finds, per column, one scale s and multiples m_g in [0, 16] with scale_g == s * m_g
// (to 1e-5 relative) for every group, writing s (panels * 16) and m_g (scale_count()). Returns
// false, with the outputs unspecified, when some column has none (group scales chosen freely, or
// not finite); the kernels then scale group by group. The quantizer (quant/quantize.hpp)
// chooses its int4 scales so that they decompose.
bool decompose_int4_scales(const PackedIntShape& s, const float* scales, float* column_scales, std::uint8_t* group_multiples);

// Packs Q [n][k] (int8: one code a byte, row stride ld bytes; int4: two's complement nibbles, even
// k in the low nibble, (k+1)/2 bytes a row at stride ld) with row scales (int8: [n]; int4:
// [n][ceil(k/group)]) into the buffers, which must hold code_bytes(), scale_count() and
// scale_count() elements; every one of them is written.
// The fastest form this CPU runs (the same bytes from each).
void pack_int_weights(const PackedIntShape& s, const std::int8_t* q, std::size_t ld, const float* row_scales, std::uint8_t* codes,
                      float* scales, std::int32_t* colsums);
// Element by element: the reference the other form is tested against.
void pack_int_weights_portable(const PackedIntShape& s, const std::int8_t* q, std::size_t ld, const float* row_scales,
                               std::uint8_t* codes, float* scales, std::int32_t* colsums);
// A block at a time in registers. Only where isa_available(Isa::avx512_bf16).
void pack_int_weights_avx512(const PackedIntShape& s, const std::int8_t* q, std::size_t ld, const float* row_scales, std::uint8_t* codes,
                             float* scales, std::int32_t* colsums);
// The scales part of pack_int_weights alone (scale_count() written).
void pack_int_scales(const PackedIntShape& s, const float* row_scales, float* scales);

// The code of packed element (col, kk), sign-extended; for tests and the portable kernel.
int packed_int_code(const PackedIntShape& s, const std::uint8_t* codes, int col, int kk);

// Activation codes (the A operand, m rows × k_padded int8) may also be given in tile order, as
// bf16 activations can (pack_bf16.hpp): rows in groups of 16 (a row tile), each (row tile t,
// k-block kb) a contiguous 1 KiB block of 16 rows × 64 codes,
//
//   tiles[((t*kblocks + kb)*16 + i)*64 + q] = A[t*16 + i][kb*64 + q]
//
// so that an AMX INT8 A tile is one contiguous read instead of 16 lines at the row stride.
inline constexpr int kIntATileRows = 16;
inline std::int8_t* int8_tile_row(std::int8_t* tiles, int k_padded, int i, int kb) {
  const int kblocks = k_padded / kIntBlockK;
  return tiles + ((static_cast<std::size_t>(i / kIntATileRows) * kblocks + kb) * kIntATileRows + i % kIntATileRows) * kIntBlockK;
}
// Bytes of an m-row A in tile order: m rounded up to whole row tiles, times k_padded.
std::size_t int8_tiled_rows_bytes(int m, int k_padded);
// Rows [0, m) of A (stride lda >= k_padded, k_padded a multiple of 64) into rows [row0, row0 + m)
// of a tile-order A, and rows [0, m) back. Rows of the tiles not written are left as they are.
void pack_int8_rows_as_tiles(const std::int8_t* a, std::size_t lda, int m, int k_padded, std::int8_t* tiles, int row0 = 0);
void unpack_int8_tiles_to_rows(const std::int8_t* tiles, int m, int k_padded, std::int8_t* a, std::size_t lda);

}  // namespace tilemoe::kernels
