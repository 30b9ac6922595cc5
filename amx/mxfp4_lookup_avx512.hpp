#pragma once
// The AVX-512 lookup of MXFP4 code lines (pack_mxfp4.hpp) into bf16, for the dequantization into
// bf16 blocks (the decode rows kernel looks them up as bytes instead, for VPDPBUSD): row t of a
// line is the line shifted right by 4t and looked up with VPERMW, which reads only an index word's
// low 5 bits, against a 32-entry table that repeats the 16 E2M1 values' bf16 bits. Include only from sources built for AVX-512.
#include "amx/immintrin_gcc12.hpp"

#include <cstdint>

#include "amx/mxfp4_bits.hpp"

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
};

}  // namespace tilemoe::kernels
