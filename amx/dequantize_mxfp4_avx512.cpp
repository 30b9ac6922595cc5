// MXFP4 blocks to packed bf16 with AVX-512: a code line (four rows of a block, pack_mxfp4.hpp)
// shifted by 0, 4, 8 and 12 bits and looked up (VPERMW) as bf16 bits, each row scaled by adding
// the group's exponent to the bf16 exponent field of its non-zero values: the bits of
// mxfp4_scaled_bits (amx/mxfp4_bits.hpp), 128 values a line.
#include "amx/immintrin_gcc12.hpp"

#include <cstdint>

#include "amx/mxfp4_bits.hpp"
#include "amx/mxfp4_lookup_avx512.hpp"
#include "amx/pack_mxfp4.hpp"

namespace tilemoe::kernels {

void dequantize_mxfp4_blocks_avx512(const PackedMxfp4Shape& s, const PackedMxfp4View& w, int nb0, int nb1, int kb0, int kb1,
                                    bf16* out) {
  const Mxfp4LineLookup lookup;
  const __m512i magnitude = _mm512_set1_epi16(0x7fff);
  const int kbs = kb1 - kb0;
  for (int nb = nb0; nb < nb1; ++nb) {
    const std::size_t first = static_cast<std::size_t>(nb) * s.kblocks + kb0;
    const std::uint8_t* src = w.codes + first * kMxfp4BlockCodeBytes;
    const std::uint8_t* ex = w.exponents + first * kMxfp4BlockExponentBytes;
    bf16* dst = out + static_cast<std::size_t>(nb - nb0) * kbs * kBlockElements;
    for (int b = 0; b < kbs; ++b, src += kMxfp4BlockCodeBytes, ex += kMxfp4BlockExponentBytes, dst += kBlockElements) {
      // Column c's addend in both words of dword c: words 2c and 2c + 1 of a block row.
      __m512i addend = _mm512_slli_epi32(
          _mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(ex))),
                           _mm512_set1_epi32(kMxfp4ExponentBias)),
          7);
      addend = _mm512_and_si512(addend, _mm512_set1_epi32(0xffff));
      addend = _mm512_or_si512(addend, _mm512_slli_epi32(addend, 16));
      for (int j = 0; j < 4; ++j) {
        const __m512i line = _mm512_loadu_si512(src + j * 64);
#pragma GCC unroll 4
        for (int t = 0; t < 4; ++t) {
          __m512i row = lookup.row(line, t);
          row = _mm512_mask_add_epi16(row, _mm512_test_epi16_mask(row, magnitude), row, addend);
          _mm512_storeu_si512(dst + (4 * j + t) * 32, row);
        }
      }
    }
  }
}

}  // namespace tilemoe::kernels
