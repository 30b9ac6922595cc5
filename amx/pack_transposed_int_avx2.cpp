// The dequantizing transposed repack with AVX2: training through a quantized base runs it over every
// weight byte of the backward, and element by element (the portable loop, a packed_int_code call a
// code) it took 98 % of an int8 fine-tuning step on a Zen 3.
//
// As in pack_transposed_int_avx512.cpp: the 8 block rows that one W panel gives a Wᵀ block are its
// 16 columns' codes for 16 k (kk0 .. kk0 + 15), 4 k-quad rows of 64 bytes (int4: 2 rows of nibble
// pairs). A 4 x 4 transpose of dwords in each 128-bit lane turns them into 16 bytes a column (its
// k in order); each column's 16 codes are widened to two ymm of f32, scaled by the column's scale
// and rounded to bf16 in the low half of every 32-bit lane, so that column c's lane OR column
// c + 1's lane shifted up is already the interleaved pair of one block row.
#include <immintrin.h>

#include <cmath>
#include <cstdint>

#include "amx/pack_transposed.hpp"

namespace tilemoe::kernels {
namespace {

// float_to_bf16 of each lane (round to nearest even, NaN kept quiet), in the lane's low 16 bits.
inline __m256i bf16_lanes(__m256 f) {
  const __m256i u = _mm256_castps_si256(f);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
  return _mm256_blendv_epi8(rounded, quiet, nan);
}

// Both lanes' float_to_bf16, even's in the low and odd's in the high 16 bits, for lanes without NaN
// (round to nearest even: bits + 0x7fff + the kept part's lowest bit, then the top 16 bits).
inline __m256i bf16_pairs_no_nan(__m256 even, __m256 odd) {
  const __m256i one = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7fff);
  const __m256i ue = _mm256_castps_si256(even), uo = _mm256_castps_si256(odd);
  const __m256i te = _mm256_add_epi32(ue, _mm256_add_epi32(bias, _mm256_and_si256(_mm256_srli_epi32(ue, 16), one)));
  const __m256i to = _mm256_add_epi32(uo, _mm256_add_epi32(bias, _mm256_and_si256(_mm256_srli_epi32(uo, 16), one)));
  return _mm256_or_si256(_mm256_srli_epi32(te, 16), _mm256_and_si256(to, _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
}

inline __m256i load_256(const std::uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// The signed codes of k-quad rows r0 .. r0 + 3 of a block, columns 8h .. 8h + 7 (32 bytes each).
inline void load_quad_rows(const PackedIntShape& s, const std::uint8_t* block, int r0, int h, __m256i (&quad)[4]) {
  const int column_byte = h * 32;
  if (s.bits == 8) {
    for (int i = 0; i < 4; ++i) quad[i] = load_256(block + (r0 + i) * 64 + column_byte);
    return;
  }
  // int4: quad rows r0, r0 + 1 are the low and high nibbles of byte row r0 / 2, r0 + 2, r0 + 3 of
  // the next; stored as code + 8.
  const __m256i nibble = _mm256_set1_epi8(0x0f), eight = _mm256_set1_epi8(8);
  for (int i = 0; i < 2; ++i) {
    const __m256i bytes = load_256(block + (r0 / 2 + i) * 64 + column_byte);
    quad[2 * i] = _mm256_sub_epi8(_mm256_and_si256(bytes, nibble), eight);
    quad[2 * i + 1] = _mm256_sub_epi8(_mm256_and_si256(_mm256_srli_epi16(bytes, 4), nibble), eight);
  }
}

// Dword i of every 128-bit lane of quad[0..3] gathered into one lane: column[i] lane L holds column
// 4L + i's 16 codes, k in order.
inline void transpose_quads(const __m256i (&quad)[4], __m256i (&column)[4]) {
  const __m256i ab_lo = _mm256_unpacklo_epi32(quad[0], quad[1]), ab_hi = _mm256_unpackhi_epi32(quad[0], quad[1]);
  const __m256i cd_lo = _mm256_unpacklo_epi32(quad[2], quad[3]), cd_hi = _mm256_unpackhi_epi32(quad[2], quad[3]);
  column[0] = _mm256_unpacklo_epi64(ab_lo, cd_lo);
  column[1] = _mm256_unpackhi_epi64(ab_lo, cd_lo);
  column[2] = _mm256_unpacklo_epi64(ab_hi, cd_hi);
  column[3] = _mm256_unpackhi_epi64(ab_hi, cd_hi);
}

// The 8 block rows (32 bf16 each, at out) of W's panel nb for W columns kk0 .. kk0 + 15: row r
// interleaves the panel's columns 2r and 2r + 1.
inline void pack_panel_rows(const PackedIntShape& s, const PackedIntView& w, int nb, int kk0, bf16* out) {
  const std::uint8_t* block =
      w.codes + (static_cast<std::size_t>(nb) * s.kblocks + kk0 / kIntBlockK) * s.block_bytes();
  const int r0 = (kk0 % kIntBlockK) / 4;
  const int g = s.bits == 8 ? 0 : kk0 / s.group;  // groups hold 32 k or more: one for all 16
  const float* scales = w.scales + (static_cast<std::size_t>(nb) * s.groups + g) * kPanelColumns;
  for (int h = 0; h < 2; ++h) {  // columns 8h .. 8h + 7: block rows 4h .. 4h + 3
    __m256i quad[4], column[4];
    load_quad_rows(s, block, r0, h, quad);
    transpose_quads(quad, column);
    alignas(32) std::int8_t codes[4][32];
    for (int i = 0; i < 4; ++i) _mm256_store_si256(reinterpret_cast<__m256i*>(codes[i]), column[i]);
    for (int pair = 0; pair < 4; ++pair) {
      const int lane = pair / 2, i = (pair % 2) * 2;  // columns 8h + 4 lane + i and + 1
      const int c = 8 * h + 2 * pair;
      const float scale_even = scales[c], scale_odd = scales[c + 1];
      const std::int8_t* even_codes = codes[i] + 16 * lane;
      const std::int8_t* odd_codes = codes[i + 1] + 16 * lane;
      bf16* row = out + (4 * h + pair) * 32;
      const bool finite = std::isfinite(scale_even) && std::isfinite(scale_odd);
      for (int half = 0; half < 2; ++half) {  // k 8 half .. 8 half + 7
        const auto widen = [&](const std::int8_t* p, float scale) {
          const __m128i eight_codes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8 * half));
          return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(eight_codes)), _mm256_set1_ps(scale));
        };
        const __m256 even = widen(even_codes, scale_even), odd = widen(odd_codes, scale_odd);
        // A finite scale never makes a NaN (an Inf scale times a zero code does).
        const __m256i pairs =
            finite ? bf16_pairs_no_nan(even, odd) : _mm256_or_si256(bf16_lanes(even), _mm256_slli_epi32(bf16_lanes(odd), 16));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(row + half * 16), pairs);
      }
    }
  }
}

}  // namespace

void pack_transposed_kblock_int_avx2(const PackedIntShape& s, const PackedIntView& w, int nb0, int nb1, int kb, bf16* dst,
                                     std::size_t dst_panel_stride) {
  walk_transposed_int_kblock(s, w, nb0, nb1, kb, dst, dst_panel_stride,
                             [&](int nb, int kk0, bf16* out) { pack_panel_rows(s, w, nb, kk0, out); });
}

}  // namespace tilemoe::kernels
