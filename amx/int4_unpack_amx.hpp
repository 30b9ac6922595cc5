#pragma once
// int4 codes unpacked into the int8 blocks that TDPBSSD reads (gemm_int_amx.cpp): a block at a
// time, next to the tile products, into a per-thread buffer that stays in L2. For *_amx.cpp files
// only (AVX-512); needs <immintrin.h> (amx/immintrin_gcc12.hpp) first.
#include <cstddef>
#include <cstdint>

#include "amx/pack_int.hpp"
#include "amx/prefetch.hpp"

namespace tilemoe::kernels {

// Block (p, kb) of an int4 matrix as one int8 block (nibble - 8), in the int8 packed order; with
// `multiples` (pack_int.hpp, decompose_int4_scales), each code times its group's multiple, so that
// one scale per column applies to a sum over all of K. VPMULLW multiplies two codes of one column
// at once: as nibbles n = code + 8, n * m <= 240 never carries into the next byte, and
// (n * m - 8 * m) mod 256 is code * m in [-128, 112].
inline void unpack_int4_block(const PackedIntShape& s, const std::uint8_t* codes, const std::uint8_t* multiples, int p, int kb,
                       std::uint8_t* out) {
  const __m512i low = _mm512_set1_epi8(0x0f);
  const std::uint8_t* in = codes + static_cast<std::size_t>(p) * s.panel_bytes() + static_cast<std::size_t>(kb) * 512;
  if (multiples == nullptr) {
    const __m512i eight = _mm512_set1_epi8(8);
    for (int rp = 0; rp < 8; ++rp) {
      const __m512i raw = _mm512_loadu_si512(in + rp * 64);
      _mm512_storeu_si512(out + (2 * rp) * 64, _mm512_sub_epi8(_mm512_and_si512(raw, low), eight));
      _mm512_storeu_si512(out + (2 * rp + 1) * 64, _mm512_sub_epi8(_mm512_and_si512(_mm512_srli_epi16(raw, 4), low), eight));
    }
    return;
  }
  __m512i m16 = _mm512_setzero_si512(), m8 = m16;
  int group = -1;
  for (int rp = 0; rp < 8; ++rp) {
    // Quad rows 2rp and 2rp+1 cover k offsets [8 rp, 8 rp + 8): one group (groups are >= 32).
    const int g = (kb * kIntBlockK + 8 * rp) / s.group;
    if (g != group) {
      group = g;
      const __m512i m = _mm512_cvtepu8_epi32(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(multiples + (static_cast<std::size_t>(p) * s.groups + g) * 16)));
      m16 = _mm512_or_si512(m, _mm512_slli_epi32(m, 16));      // m in both 16-bit halves of a column's 4 bytes
      m8 = _mm512_mullo_epi32(m, _mm512_set1_epi32(0x08080808));  // 8 m in each of its 4 bytes
    }
    const __m512i raw = _mm512_loadu_si512(in + rp * 64);
    const __m512i lo = _mm512_and_si512(raw, low), hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low);
    _mm512_storeu_si512(out + (2 * rp) * 64, _mm512_sub_epi8(_mm512_mullo_epi16(lo, m16), m8));
    _mm512_storeu_si512(out + (2 * rp + 1) * 64, _mm512_sub_epi8(_mm512_mullo_epi16(hi, m16), m8));
  }
}

// One int4 panel pair (or last single panel) unpacked a k-block at a time into its int8 panels:
// by the pair's first row block, block kb + 1 during k-step kb, so that the tiles multiply while
// the vector units unpack (gemm_mxfp4_amx.cpp does the same for MXFP4).
struct PairUnpack {
  const PackedIntShape* s = nullptr;
  const std::uint8_t* codes = nullptr;
  const std::uint8_t* multiples = nullptr;
  std::uint8_t* out = nullptr;  // panel p0's blocks, then p0 + 1's
  int p0 = 0;
  bool two = false;

  // Block kb of each panel, asking for the codes kCodeAheadBlocks blocks on (a prefetch past
  // the matrix never faults).
  void block(int kb) const {
    constexpr std::size_t kCodeAheadBlocks = 2, kCodeBlockBytes = 512;
    const std::size_t panel = static_cast<std::size_t>(s->kblocks) * kTileBlockBytes;
    for (int q = 0; q < (two ? 2 : 1); ++q) {
      const std::uint8_t* ahead = codes + static_cast<std::size_t>(p0 + q) * s->panel_bytes() + (kb + kCodeAheadBlocks) * kCodeBlockBytes;
      for (std::size_t line = 0; line < kCodeBlockBytes; line += 64) _mm_prefetch(reinterpret_cast<const char*>(ahead + line), _MM_HINT_T0);
      unpack_int4_block(*s, codes, multiples, p0 + q, kb, out + q * panel + static_cast<std::size_t>(kb) * kTileBlockBytes);
    }
  }
};

// int4's codes, unpacked into int8 panels at `out` (panel p0 first: a panel group's, or one pair's)
// pair by pair by the first row block that meets each pair.
struct Int4Unpack {
  const PackedIntShape* shape;
  const std::uint8_t* codes;
  const std::uint8_t* multiples;  // or null: unpack without them
  std::uint8_t* out;
  int p0;

  // Pair p (one panel unless `two`): its first k-block now, the others by the tile_block given
  // the result.
  PairUnpack start_pair(int p, bool two) const {
    const std::size_t panel = static_cast<std::size_t>(shape->kblocks) * kTileBlockBytes;
    const PairUnpack unpack{shape, codes, multiples, out + static_cast<std::size_t>(p - p0) * panel, p, two};
    if (shape->kblocks > 0) unpack.block(0);
    __asm__ volatile("" ::: "memory");
    return unpack;
  }
};

}  // namespace tilemoe::kernels
