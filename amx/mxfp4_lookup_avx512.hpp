#pragma once
// The AVX-512 lookup of MXFP4 code lines (pack_mxfp4.hpp) into bf16, for the dequantization into
// bf16 blocks (the decode rows kernel looks them up as bytes instead, for VPDPBUSD): row t of a
// line is the line shifted right by 4t and looked up with VPERMW, which reads only an index word's
// low 5 bits, against a 32-entry table that repeats the 16 E2M1 values' bf16 bits. Include only from sources built for AVX-512.
#include "amx/immintrin_gcc12.hpp"

#include <cstdint>

#include "amx/mxfp4_bits.hpp"
#include "tilemoe/bf16.hpp"
#include "tilemoe/mxfp4.hpp"

namespace tilemoe::kernels {

struct Mxfp4LineLookup {
  __m512i table;
  Mxfp4LineLookup() {
    alignas(64) std::uint16_t bits[32];
    for (int i = 0; i < 32; ++i) bits[i] = kE2m1Bf16Bits[i & 15];
    table = _mm512_load_si512(bits);
  }
  // Row 4j + t of a block (its E2M1 values as bf16, not yet scaled) from the block's code line j.
  __m512i row(__m512i line, int t) const { return _mm512_permutexvar_epi16(t == 0 ? line : _mm512_srli_epi16(line, 4 * t), table); }

  // One block (256 code bytes, its 16 exponents) into its packed bf16 block (1 KiB, one B tile):
  // each row scaled by adding the group's exponent to the bf16 exponent field of its non-zero
  // values, the bits of mxfp4_scaled_bits (mxfp4_bits.hpp).
  void block(const std::uint8_t* codes, const std::uint8_t* exponents, bf16* dst) const {
    const __m512i magnitude = _mm512_set1_epi16(0x7fff);
    // Column c's addend in both words of dword c: words 2c and 2c + 1 of a block row.
    __m512i addend = _mm512_slli_epi32(
        _mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(exponents))),
                         _mm512_set1_epi32(kMxfp4ExponentBias)),
        7);
    addend = _mm512_and_si512(addend, _mm512_set1_epi32(0xffff));
    addend = _mm512_or_si512(addend, _mm512_slli_epi32(addend, 16));
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      const __m512i line = _mm512_loadu_si512(codes + j * 64);
#pragma GCC unroll 4
      for (int t = 0; t < 4; ++t) {
        __m512i r = row(line, t);
        r = _mm512_mask_add_epi16(r, _mm512_test_epi16_mask(r, magnitude), r, addend);
        _mm512_storeu_si512(dst + (4 * j + t) * 32, r);
      }
    }
  }
};

}  // namespace tilemoe::kernels
