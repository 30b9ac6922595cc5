// The dequantizing transposed repack with AVX-512: training through a quantized base runs it over
// every weight byte of the backward.
//
// One output row of a Wᵀ block is 16 W columns (kk0 .. kk0 + 15, kk0 a multiple of 16) of two W
// rows h, h + 1, interleaved. In the int layout those 16 codes of one row are 4 k-quads at a
// 64-byte stride (int8: 4 dwords; int4: 2 dwords, low then high nibbles), and share one scale
// (a group holds 32 or more k). So: gather, widen to 32-bit, scale, round both rows to bf16 in
// one instruction, interleave their words.
#include "amx/immintrin_gcc12.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>

#include "amx/bf16_avx512.hpp"
#include "amx/pack_transposed.hpp"

namespace tilemoe::kernels {
namespace {

inline std::uint32_t load_u32(const std::uint8_t* p) {
  std::uint32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// W[h][kk0 .. kk0 + 15] as f32; `subnormal` is set when the row's scale is subnormal, the only
// case in which a product (code x scale) is: VCVTNE2PS2BF16 would flush those to zero.
inline __m512 dequantize_16(const PackedIntShape& s, const PackedIntView& w, int h, int kk0, bool& subnormal) {
  const int nb = h / kPanelColumns, c = h % kPanelColumns;
  const int kbi = kk0 / kIntBlockK, r0 = (kk0 % kIntBlockK) / 4;
  const std::uint8_t* block = w.codes + (static_cast<std::size_t>(nb) * s.kblocks + kbi) * s.block_bytes();
  const int g = s.bits == 8 ? 0 : kk0 / s.group;
  const float scale = w.scales[(static_cast<std::size_t>(nb) * s.groups + g) * kPanelColumns + c];
  subnormal = subnormal || std::fpclassify(scale) == FP_SUBNORMAL;
  __m512i codes;
  if (s.bits == 8) {
    const std::uint8_t* p = block + static_cast<std::size_t>(r0) * 64 + c * 4;
    const __m128i bytes = _mm_set_epi32(static_cast<int>(load_u32(p + 192)), static_cast<int>(load_u32(p + 128)),
                                        static_cast<int>(load_u32(p + 64)), static_cast<int>(load_u32(p)));
    codes = _mm512_cvtepi8_epi32(bytes);
  } else {
    // Quad rows r0, r0 + 1 share byte row r0 / 2 (low, high nibble); r0 + 2, r0 + 3 the next.
    const std::uint8_t* p = block + static_cast<std::size_t>(r0 / 2) * 64 + c * 4;
    const std::uint32_t d0 = load_u32(p), d1 = load_u32(p + 64), m = 0x0f0f0f0fu;
    const __m128i nibbles = _mm_set_epi32(static_cast<int>((d1 >> 4) & m), static_cast<int>(d1 & m), static_cast<int>((d0 >> 4) & m),
                                          static_cast<int>(d0 & m));
    codes = _mm512_sub_epi32(_mm512_cvtepu8_epi32(nibbles), _mm512_set1_epi32(8));
  }
  return _mm512_mul_ps(_mm512_cvtepi32_ps(codes), _mm512_set1_ps(scale));
}

}  // namespace

void pack_transposed_kblock_int_avx512(const PackedIntShape& s, const PackedIntView& w, int nb0, int nb1, int kb, bf16* dst,
                                       std::size_t dst_panel_stride) {
  const int panels = nb1 - nb0;
  const int tkblocks = transposed_kblocks(panels);
  const int rows = panels * kPanelColumns;
  // Words of cvtne2ps_pbh(odd, even) are even[0..15], odd[0..15]; the block row wants them paired.
  const __m512i pair = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3,
                                        18, 2, 17, 1, 16, 0);
  // A call reads kBlockK codes of every panel, the panels a panel's bytes apart (a new page each
  // time, where the hardware prefetchers start over), and the next call the next kBlockK of each:
  // asked for into L2 here, they no longer wait on memory one by one.
  const std::size_t kb_bytes = static_cast<std::size_t>(kBlockK) * kPanelColumns * s.bits / 8;
  const bool prefetch_next = (kb + 1) * kBlockK < s.k_padded;
  for (int q = 0; q < 2; ++q) {
    const int kk0 = kb * kBlockK + q * kPanelColumns;
    for (int j = 0; j < tkblocks; ++j) {
      if (q == 0 && prefetch_next) {
        for (int nb = nb0 + 2 * j; nb < nb1 && nb < nb0 + 2 * j + 2; ++nb) {
          const std::uint8_t* next = w.codes + static_cast<std::size_t>(nb) * s.panel_bytes() + (kb + 1) * kb_bytes;
          for (std::size_t line = 0; line < kb_bytes; line += 64) __builtin_prefetch(next + line, 0, 2);
        }
      }
      bf16* out = dst + q * dst_panel_stride + static_cast<std::size_t>(j) * kBlockElements;
      for (int r = 0; r < kBlockK / 2; ++r) {
        const int hl = j * kBlockK + 2 * r;  // rows is a multiple of 16: hl and hl + 1 are both in or both out
        __m512i row = _mm512_setzero_si512();
        if (hl < rows) {
          const int h = nb0 * kPanelColumns + hl;
          bool subnormal = false;
          const __m512 even = dequantize_16(s, w, h, kk0, subnormal), odd = dequantize_16(s, w, h + 1, kk0, subnormal);
          __m512i words;
          if (!subnormal) {
            const __m512bh both = _mm512_cvtne2ps_pbh(odd, even);
            std::memcpy(&words, &both, sizeof words);
          } else {  // float_to_bf16's rounding of subnormals (bf16_avx512.hpp)
            words = _mm512_inserti64x4(_mm512_castsi256_si512(to_bf16(even)), to_bf16(odd), 1);
          }
          row = _mm512_permutexvar_epi16(pair, words);
        }
        _mm512_storeu_si512(out + r * 32, row);
      }
    }
  }
}

}  // namespace tilemoe::kernels
