// The dequantizing transposed repack with AVX2: training through a quantized base runs it over every
// weight byte of the backward, and element by element (the portable loop, a packed_int_code call a
// code) it took 98 % of an int8 fine-tuning step on a Zen 3.
//
// As in pack_transposed_int_avx512.cpp: one output row of a Wᵀ block is 16 W columns (kk0 .. kk0 +
// 15) of two W rows h, h + 1, interleaved; those 16 codes of one row are 4 k-quads at a 64-byte
// stride and share one scale. Here each row's 16 values are two ymm of f32, rounded to bf16 in the
// low half of every 32-bit lane, so that row h's lane OR row h + 1's lane shifted up is already the
// interleaved pair of one column.
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "amx/pack_transposed.hpp"

namespace tilemoe::kernels {
namespace {

inline std::uint32_t load_u32(const std::uint8_t* p) {
  std::uint32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// W[h][kk0 .. kk0 + 15] as f32: columns 0-7 in half[0], 8-15 in half[1].
// Returns whether the row's scale is finite: the products are then never NaN (an Inf scale times a
// zero code is).
inline bool dequantize_16(const PackedIntShape& s, const PackedIntView& w, int h, int kk0, __m256 (&half)[2]) {
  const int nb = h / kPanelColumns, c = h % kPanelColumns;
  const int kbi = kk0 / kIntBlockK, r0 = (kk0 % kIntBlockK) / 4;
  const std::uint8_t* block = w.codes + (static_cast<std::size_t>(nb) * s.kblocks + kbi) * s.block_bytes();
  const int g = s.bits == 8 ? 0 : kk0 / s.group;
  const float scale_value = w.scales[(static_cast<std::size_t>(nb) * s.groups + g) * kPanelColumns + c];
  const __m256 scale = _mm256_set1_ps(scale_value);
  __m256i codes[2];
  if (s.bits == 8) {
    const std::uint8_t* p = block + static_cast<std::size_t>(r0) * 64 + c * 4;
    const __m128i bytes = _mm_set_epi32(static_cast<int>(load_u32(p + 192)), static_cast<int>(load_u32(p + 128)),
                                        static_cast<int>(load_u32(p + 64)), static_cast<int>(load_u32(p)));
    codes[0] = _mm256_cvtepi8_epi32(bytes);
    codes[1] = _mm256_cvtepi8_epi32(_mm_srli_si128(bytes, 8));
  } else {
    // Quad rows r0, r0 + 1 share byte row r0 / 2 (low, high nibble); r0 + 2, r0 + 3 the next.
    const std::uint8_t* p = block + static_cast<std::size_t>(r0 / 2) * 64 + c * 4;
    const std::uint32_t d0 = load_u32(p), d1 = load_u32(p + 64), m = 0x0f0f0f0fu;
    const __m128i nibbles = _mm_set_epi32(static_cast<int>((d1 >> 4) & m), static_cast<int>(d1 & m), static_cast<int>((d0 >> 4) & m),
                                          static_cast<int>(d0 & m));
    const __m256i eight = _mm256_set1_epi32(8);
    codes[0] = _mm256_sub_epi32(_mm256_cvtepu8_epi32(nibbles), eight);
    codes[1] = _mm256_sub_epi32(_mm256_cvtepu8_epi32(_mm_srli_si128(nibbles, 8)), eight);
  }
  half[0] = _mm256_mul_ps(_mm256_cvtepi32_ps(codes[0]), scale);
  half[1] = _mm256_mul_ps(_mm256_cvtepi32_ps(codes[1]), scale);
  return std::isfinite(scale_value);
}

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

}  // namespace

void pack_transposed_kblock_int_avx2(const PackedIntShape& s, const PackedIntView& w, int nb0, int nb1, int kb, bf16* dst,
                                     std::size_t dst_panel_stride) {
  const int panels = nb1 - nb0;
  const int tkblocks = transposed_kblocks(panels);
  const int rows = panels * kPanelColumns;
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
        __m256i pairs[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
        if (hl < rows) {
          const int h = nb0 * kPanelColumns + hl;
          __m256 even[2], odd[2];
          const bool finite = dequantize_16(s, w, h, kk0, even) & dequantize_16(s, w, h + 1, kk0, odd);
          for (int i = 0; i < 2; ++i)
            pairs[i] = finite ? bf16_pairs_no_nan(even[i], odd[i])
                              : _mm256_or_si256(bf16_lanes(even[i]), _mm256_slli_epi32(bf16_lanes(odd[i]), 16));
        }
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + r * 32), pairs[0]);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + r * 32 + 16), pairs[1]);
      }
    }
  }
}

}  // namespace tilemoe::kernels
