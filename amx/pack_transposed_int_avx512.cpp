// The dequantizing transposed repack with AVX-512: training through a quantized base runs it over
// every weight byte of the backward.
//
// The 8 block rows that one W panel gives a Wᵀ block are its 16 columns' codes for 16 k (kk0 ..
// kk0 + 15, kk0 a multiple of 16): in the int layout 4 k-quad rows of 64 bytes, a dword per column
// (int4: 2 rows of nibble pairs, low then high). A 4 x 4 transpose of dwords in each 128-bit lane
// gives 16 bytes a column, its k in order, which share one scale (a group holds 32 or more k). So:
// load the rows, transpose, then a column pair at a time widen to 32-bit, scale, round both
// columns to bf16 in one instruction and interleave their words.
#include "amx/immintrin_gcc12.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>

#include "amx/bf16_avx512.hpp"
#include "amx/pack_transposed.hpp"

namespace tilemoe::kernels {
namespace {

// The signed codes of k-quad rows r0 .. r0 + 3 of a block, a row of 16 dwords (one per column).
inline void load_quad_rows(const PackedIntShape& s, const std::uint8_t* block, int r0, __m512i (&quad)[4]) {
  if (s.bits == 8) {
    for (int i = 0; i < 4; ++i) quad[i] = _mm512_loadu_si512(block + (r0 + i) * 64);
    return;
  }
  // int4: quad rows r0, r0 + 1 are the low and high nibbles of byte row r0 / 2, r0 + 2, r0 + 3 of
  // the next; stored as code + 8.
  const __m512i nibble = _mm512_set1_epi8(0x0f), eight = _mm512_set1_epi8(8);
  for (int i = 0; i < 2; ++i) {
    const __m512i bytes = _mm512_loadu_si512(block + (r0 / 2 + i) * 64);
    quad[2 * i] = _mm512_sub_epi8(_mm512_and_si512(bytes, nibble), eight);
    quad[2 * i + 1] = _mm512_sub_epi8(_mm512_and_si512(_mm512_srli_epi16(bytes, 4), nibble), eight);
  }
}

// Dword i of every 128-bit lane of quad[0..3] gathered into one lane: column[i] lane L holds column
// 4L + i's 16 codes, k in order.
inline void transpose_quads(const __m512i (&quad)[4], __m512i (&column)[4]) {
  const __m512i ab_lo = _mm512_unpacklo_epi32(quad[0], quad[1]), ab_hi = _mm512_unpackhi_epi32(quad[0], quad[1]);
  const __m512i cd_lo = _mm512_unpacklo_epi32(quad[2], quad[3]), cd_hi = _mm512_unpackhi_epi32(quad[2], quad[3]);
  column[0] = _mm512_unpacklo_epi64(ab_lo, cd_lo);
  column[1] = _mm512_unpackhi_epi64(ab_lo, cd_lo);
  column[2] = _mm512_unpacklo_epi64(ab_hi, cd_hi);
  column[3] = _mm512_unpackhi_epi64(ab_hi, cd_hi);
}

// The 8 block rows (32 bf16 each, at out) of W's panel nb for W columns kk0 .. kk0 + 15: row r
// interleaves the panel's columns 2r and 2r + 1.
inline void pack_panel_rows(const PackedIntShape& s, const PackedIntView& w, int nb, int kk0, __m512i pair_words, bf16* out) {
  const std::uint8_t* block =
      w.codes + (static_cast<std::size_t>(nb) * s.kblocks + kk0 / kIntBlockK) * s.block_bytes();
  const int r0 = (kk0 % kIntBlockK) / 4;
  const int g = s.bits == 8 ? 0 : kk0 / s.group;  // groups hold 32 k or more: one for all 16
  const float* scales = w.scales + (static_cast<std::size_t>(nb) * s.groups + g) * kPanelColumns;
  __m512i quad[4], column[4];
  load_quad_rows(s, block, r0, quad);
  transpose_quads(quad, column);
  alignas(64) std::int8_t codes[4][64];
  for (int i = 0; i < 4; ++i) _mm512_store_si512(codes[i], column[i]);
  for (int r = 0; r < 8; ++r) {
    const int lane = r / 2, i = (r % 2) * 2;  // columns 2r = 4 lane + i and 2r + 1
    const auto widen = [&](const std::int8_t* p, float scale) {
      const __m128i sixteen_codes = _mm_load_si128(reinterpret_cast<const __m128i*>(p + 16 * lane));
      return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(sixteen_codes)), _mm512_set1_ps(scale));
    };
    const float scale_even = scales[2 * r], scale_odd = scales[2 * r + 1];
    const __m512 even = widen(codes[i], scale_even), odd = widen(codes[i + 1], scale_odd);
    __m512i words;
    // A product is subnormal only where its scale is, and VCVTNE2PS2BF16 would flush it to zero.
    if (std::fpclassify(scale_even) != FP_SUBNORMAL && std::fpclassify(scale_odd) != FP_SUBNORMAL) {
      const __m512bh both = _mm512_cvtne2ps_pbh(odd, even);
      std::memcpy(&words, &both, sizeof words);
    } else {  // float_to_bf16's rounding of subnormals (bf16_avx512.hpp)
      words = _mm512_inserti64x4(_mm512_castsi256_si512(to_bf16(even)), to_bf16(odd), 1);
    }
    _mm512_storeu_si512(out + r * 32, _mm512_permutexvar_epi16(pair_words, words));
  }
}

}  // namespace

void pack_transposed_kblock_int_avx512(const PackedIntShape& s, const PackedIntView& w, int nb0, int nb1, int kb, bf16* dst,
                                       std::size_t dst_panel_stride) {
  // Words of cvtne2ps_pbh(odd, even) are even[0..15], odd[0..15]; the block row wants them paired.
  const __m512i pair_words = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21, 5, 20,
                                              4, 19, 3, 18, 2, 17, 1, 16, 0);
  walk_transposed_int_kblock(s, w, nb0, nb1, kb, dst, dst_panel_stride,
                             [&](int nb, int kk0, bf16* out) { pack_panel_rows(s, w, nb, kk0, pair_words, out); });
}

}  // namespace tilemoe::kernels
