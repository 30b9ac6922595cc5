// pack_int_weights with AVX-512, a block at a time: the packing of every int8/int4 weight byte of
// a quantized model at load. Element by element (pack_int_weights_portable) it wrote each code
// to its own place in the block and ran at about 0.2 GB/s a thread, so that packing a quantized
// model took longer than reading it.
//
// A block is 16 columns x 64 k. Each column's 64 codes (int8 as they are; int4 widened from 32
// bytes of nibbles and sign-extended) are one zmm, 16 k-quads of 4 bytes; a 16 x 16 transpose of
// those 32-bit quads gives the block's rows (quad r of every column). int8 stores them; int4 packs
// two quad rows into one byte row as nibbles (code + 8). The column sums come from the same rows
// by VPDPBUSD with ones.
#include "amx/immintrin_gcc12.hpp"

#include <algorithm>
#include <cstdint>

#include "amx/pack_int.hpp"
#include "amx/transpose_avx512.hpp"

namespace tilemoe::kernels {
namespace {

// Lanes [0, count) of 64, count clamped to [0, 64].
inline __mmask64 lanes64(int count) {
  if (count <= 0) return 0;
  if (count >= 64) return ~__mmask64{0};
  return (__mmask64{1} << count) - 1;
}

// Codes [k0, k0 + 64) of one source row as 64 int8 lanes, zero from k on.
inline __m512i int8_codes(const std::int8_t* row, int k0, int k) {
  return _mm512_maskz_loadu_epi8(lanes64(k - k0), row + k0);
}

// The same from a row of nibbles (even k low): byte i of the 32 read becomes lanes 2i (low
// nibble) and 2i + 1 (high), each sign-extended from 4 bits.
inline __m512i int4_codes(const std::int8_t* row, int k0, int k) {
  const int have = k - k0;  // codes of this block in the row (> 0)
  const __m256i bytes = _mm256_maskz_loadu_epi8(static_cast<__mmask32>(lanes64((have + 1) / 2)), row + k0 / 2);
  const __m512i w = _mm512_cvtepu8_epi16(bytes);
  // Word i = byte i: its low nibble stays in the low byte, its high nibble moves to the high one.
  const __m512i split = _mm512_or_si512(_mm512_and_si512(w, _mm512_set1_epi16(0x000f)),
                                        _mm512_slli_epi16(_mm512_and_si512(w, _mm512_set1_epi16(0x00f0)), 4));
  const __m512i eight = _mm512_set1_epi8(8);
  const __m512i codes = _mm512_sub_epi8(_mm512_xor_si512(split, eight), eight);
  return _mm512_maskz_mov_epi8(lanes64(have), codes);  // an odd k's last high nibble is not a code
}

}  // namespace

void pack_int_weights_avx512(const PackedIntShape& s, const std::int8_t* q, std::size_t ld, const float* row_scales, std::uint8_t* codes,
                             float* scales, std::int32_t* colsums) {
  pack_int_scales(s, row_scales, scales);
  std::fill(colsums, colsums + s.scale_count(), 0);
  const __m512i ones = _mm512_set1_epi8(1);
  const __m512i eight = _mm512_set1_epi8(8);
  // Quad rows of one scale group within a block: 8 at group 32, all 16 otherwise.
  const int rows_per_group = std::min(16, s.group / 4);
  std::uint8_t* out = codes;
  for (int nb = 0; nb < s.panels; ++nb) {
    const int columns = std::min(16, s.n - nb * 16);
    for (int kb = 0; kb < s.kblocks; ++kb, out += s.block_bytes()) {
      const int k0 = kb * kIntBlockK;
      __m512 x[16];
      for (int c = 0; c < 16; ++c) {
        __m512i v = _mm512_setzero_si512();
        if (c < columns && k0 < s.k) {
          const std::int8_t* row = q + static_cast<std::size_t>(nb * 16 + c) * ld;
          v = s.bits == 8 ? int8_codes(row, k0, s.k) : int4_codes(row, k0, s.k);
        }
        x[c] = _mm512_castsi512_ps(v);
      }
      transpose16(x);  // x[r] lane c = k-quad r of column c
      for (int r0 = 0; r0 < 16; r0 += rows_per_group) {
        __m512i sum = _mm512_setzero_si512();
        for (int r = r0; r < r0 + rows_per_group; ++r) sum = _mm512_dpbusd_epi32(sum, ones, _mm512_castps_si512(x[r]));
        const int g = (k0 + 4 * r0) / s.group;
        std::int32_t* at = colsums + (static_cast<std::size_t>(nb) * s.groups + g) * 16;
        _mm512_storeu_si512(at, _mm512_add_epi32(_mm512_loadu_si512(at), sum));
      }
      if (s.bits == 8) {
        for (int r = 0; r < 16; ++r) _mm512_storeu_ps(out + r * 64, x[r]);
        continue;
      }
      for (int j = 0; j < 8; ++j) {
        const __m512i low = _mm512_add_epi8(_mm512_castps_si512(x[2 * j]), eight);       // 0..15
        const __m512i high = _mm512_add_epi8(_mm512_castps_si512(x[2 * j + 1]), eight);  // 0..15
        _mm512_storeu_si512(out + j * 64, _mm512_or_si512(low, _mm512_slli_epi16(high, 4)));
      }
    }
  }
}

}  // namespace tilemoe::kernels
