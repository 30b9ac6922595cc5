// MXFP4 blocks to packed bf16 with AVX2, the same bits as the portable loop: a code line (four rows
// of a block, pack_mxfp4.hpp) shifted by 0, 4, 8 and 12 bits, masked to its nibbles and looked up
// as bf16 bits by two VPSHUFB (the low and the high byte of the 16 E2M1 values' bits), each row
// scaled by adding the group's exponent to the bf16 exponent field of its non-zero values. The
// portable loop, a nibble at a time, held gpt-oss decode on a Zen 3 at 50 times its floor.
#include <immintrin.h>

#include <cstdint>

#include "amx/mxfp4_bits.hpp"
#include "amx/pack_mxfp4.hpp"

namespace tilemoe::kernels {
namespace {

struct Mxfp4LineLookupAvx2 {
  __m256i low, high;  // byte i of each 128-bit lane: the low / high byte of kE2m1Bf16Bits[i]
  Mxfp4LineLookupAvx2() {
    alignas(16) std::uint8_t lo[16], hi[16];
    for (int i = 0; i < 16; ++i) {
      lo[i] = static_cast<std::uint8_t>(kE2m1Bf16Bits[i] & 0xff);
      hi[i] = static_cast<std::uint8_t>(kE2m1Bf16Bits[i] >> 8);
    }
    low = _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(lo)));
    high = _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(hi)));
  }

  // Nibble t of every word of `codes` as the bf16 bits of its E2M1 value.
  __m256i row(__m256i codes, int t) const {
    const __m256i index = _mm256_and_si256(t == 0 ? codes : _mm256_srli_epi16(codes, 4 * t), _mm256_set1_epi16(0x0f));
    // A word's high index byte is 0: the low table's byte 0 (0x00) there, and the high table's
    // byte moved up into it.
    return _mm256_or_si256(_mm256_shuffle_epi8(low, index), _mm256_slli_epi16(_mm256_shuffle_epi8(high, index), 8));
  }

  // One block (256 code bytes, its 16 exponents) into its packed bf16 block (1 KiB): the bits of
  // mxfp4_scaled_bits (mxfp4_bits.hpp), the addend a 16-bit add that wraps as the portable one's.
  void block(const std::uint8_t* codes, const std::uint8_t* exponents, bf16* dst) const {
    // Columns 0-7 (words 0-15 of a block row) and 8-15: column c's addend in both words of dword c.
    __m256i addend[2];
    for (int h = 0; h < 2; ++h) {
      const __m128i e = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(exponents + 8 * h));
      __m256i a = _mm256_slli_epi32(_mm256_sub_epi32(_mm256_cvtepu8_epi32(e), _mm256_set1_epi32(kMxfp4ExponentBias)), 7);
      a = _mm256_and_si256(a, _mm256_set1_epi32(0xffff));
      addend[h] = _mm256_or_si256(a, _mm256_slli_epi32(a, 16));
    }
    const __m256i magnitude = _mm256_set1_epi16(0x7fff), zero = _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        const __m256i line = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + j * 64 + h * 32));
#pragma GCC unroll 4
        for (int t = 0; t < 4; ++t) {
          const __m256i r = row(line, t);
          const __m256i is_zero = _mm256_cmpeq_epi16(_mm256_and_si256(r, magnitude), zero);
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + (4 * j + t) * 32 + h * 16),
                              _mm256_add_epi16(r, _mm256_andnot_si256(is_zero, addend[h])));
        }
      }
    }
  }
};

}  // namespace

void dequantize_mxfp4_blocks_avx2(const PackedMxfp4Shape& s, const PackedMxfp4View& w, int nb0, int nb1, int kb0, int kb1,
                                  bf16* out) {
  const Mxfp4LineLookupAvx2 lookup;
  walk_mxfp4_blocks(s, w, nb0, nb1, kb0, kb1, out,
                    [&](const std::uint8_t* codes, const std::uint8_t* exponents, bf16* dst) { lookup.block(codes, exponents, dst); });
}

}  // namespace tilemoe::kernels
