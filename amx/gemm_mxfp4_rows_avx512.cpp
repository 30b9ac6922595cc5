// MXFP4 decode rows with AVX-512: the bf16 kernel's register blocking (gemm_bf16_avx512.cpp: up to
// 4 rows x 4 panels, a k-pair of each A row broadcast, one _mm512_dpbf16_ps per 16 columns x 2 k),
// fed by block rows dequantized in registers as dequantize_mxfp4_avx512.cpp does. The weights
// stream at 4.25 bits each and never exist as bf16 in memory, so decode reads a quarter of bf16's
// bytes. Each panel stream asks for its codes two blocks (8 lines) ahead.
#include "amx/immintrin_gcc12.hpp"

#include <cstdint>
#include <cstring>

#include "amx/gemm_mxfp4.hpp"
#include "amx/mxfp4_bits.hpp"

namespace tilemoe::kernels {
namespace {

constexpr int kMaxRows = kMxfp4RowsMaxRows;
constexpr int kMaxPanels = 4;
constexpr int kPrefetchBlocks = 2;

inline __m512i broadcast_pair(const bf16* p) {
  std::int32_t v;
  std::memcpy(&v, p, sizeof v);
  return _mm512_set1_epi32(v);
}

struct Decoder {
  __m512i lut, low_nibble, magnitude, bias, word;
  Decoder() {
    alignas(64) std::uint16_t table[32];
    for (int i = 0; i < 32; ++i) table[i] = kE2m1Bf16Bits[i & 15];
    lut = _mm512_load_si512(table);
    low_nibble = _mm512_set1_epi16(0x0f);
    magnitude = _mm512_set1_epi16(0x7fff);
    bias = _mm512_set1_epi32(kMxfp4ExponentBias);
    word = _mm512_set1_epi32(0xffff);
  }
  // Column c's exponent addend in both words of dword c.
  __m512i addend(const std::uint8_t* exponents) const {
    __m512i a = _mm512_slli_epi32(_mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(exponents))), bias), 7);
    a = _mm512_and_si512(a, word);
    return _mm512_or_si512(a, _mm512_slli_epi32(a, 16));
  }
  // Block rows 2j (even) and 2j + 1 (odd) from their 32 code bytes.
  void rows(const std::uint8_t* codes, __m512i addend, __m512i& even, __m512i& odd) const {
    const __m512i bytes = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes)));
    even = _mm512_permutexvar_epi16(_mm512_and_si512(bytes, low_nibble), lut);
    odd = _mm512_permutexvar_epi16(_mm512_srli_epi16(bytes, 4), lut);
    even = _mm512_mask_add_epi16(even, _mm512_test_epi16_mask(even, magnitude), even, addend);
    odd = _mm512_mask_add_epi16(odd, _mm512_test_epi16_mask(odd, magnitude), odd, addend);
  }
};

template <int R, int P>
void block(const GemmBf16Args& g, const PackedMxfp4Shape& s, const PackedMxfp4View& w, const Decoder& d, int row0, int panel) {
  __m512 acc[R][P];
#pragma GCC unroll 4
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) acc[i][p] = _mm512_setzero_ps();
  const std::size_t code_stride = static_cast<std::size_t>(s.kblocks) * kMxfp4BlockCodeBytes;
  const std::size_t exponent_stride = static_cast<std::size_t>(s.kblocks) * kMxfp4BlockExponentBytes;
  const std::uint8_t* codes0 = w.codes + static_cast<std::size_t>(panel) * code_stride;
  const std::uint8_t* exponents0 = w.exponents + static_cast<std::size_t>(panel) * exponent_stride;
  const bf16* a0 = g.a + static_cast<std::size_t>(row0) * g.lda;
  for (int kb = 0; kb < s.kblocks; ++kb) {
    const std::uint8_t* codes = codes0 + static_cast<std::size_t>(kb) * kMxfp4BlockCodeBytes;
    const std::uint8_t* exponents = exponents0 + static_cast<std::size_t>(kb) * kMxfp4BlockExponentBytes;
    __m512i addend[P];
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) addend[p] = d.addend(exponents + p * exponent_stride);
    const bf16* ak = a0 + static_cast<std::size_t>(kb) * kBlockK;
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      __m512i x_even[R], x_odd[R];
#pragma GCC unroll 4
      for (int i = 0; i < R; ++i) {
        x_even[i] = broadcast_pair(ak + i * g.lda + 4 * j);
        x_odd[i] = broadcast_pair(ak + i * g.lda + 4 * j + 2);
      }
#pragma GCC unroll 4
      for (int p = 0; p < P; ++p) {
        const std::uint8_t* row = codes + p * code_stride + j * 32;
        if (j % 2 == 0) _mm_prefetch(reinterpret_cast<const char*>(row + kPrefetchBlocks * kMxfp4BlockCodeBytes), _MM_HINT_T0);
        __m512i even, odd;
        d.rows(row, addend[p], even, odd);
#pragma GCC unroll 4
        for (int i = 0; i < R; ++i) {
          acc[i][p] = _mm512_dpbf16_ps(acc[i][p], (__m512bh)x_even[i], (__m512bh)even);
          acc[i][p] = _mm512_dpbf16_ps(acc[i][p], (__m512bh)x_odd[i], (__m512bh)odd);
        }
      }
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) {
      float* c = g.c + static_cast<std::size_t>(row0 + i) * g.ldc + static_cast<std::size_t>(panel - g.panel_begin + p) * kPanelColumns;
      _mm512_storeu_ps(c, g.accumulate ? _mm512_add_ps(_mm512_loadu_ps(c), acc[i][p]) : acc[i][p]);
    }
}

template <int R>
void rows_of(const GemmBf16Args& g, const PackedMxfp4Shape& s, const PackedMxfp4View& w, const Decoder& d, int row0) {
  int panel = g.panel_begin;
  for (; panel + kMaxPanels <= g.panel_end; panel += kMaxPanels) block<R, kMaxPanels>(g, s, w, d, row0, panel);
  switch (g.panel_end - panel) {
    case 3: block<R, 3>(g, s, w, d, row0, panel); break;
    case 2: block<R, 2>(g, s, w, d, row0, panel); break;
    case 1: block<R, 1>(g, s, w, d, row0, panel); break;
    default: break;
  }
}

}  // namespace

void gemm_mxfp4_rows_avx512(const GemmBf16Args& g, const PackedMxfp4Shape& s, const PackedMxfp4View& w) {
  const Decoder d;
  for (int row0 = 0; row0 < g.m; row0 += kMaxRows) {
    switch (g.m - row0 >= kMaxRows ? kMaxRows : g.m - row0) {
      case 4: rows_of<4>(g, s, w, d, row0); break;
      case 3: rows_of<3>(g, s, w, d, row0); break;
      case 2: rows_of<2>(g, s, w, d, row0); break;
      default: rows_of<1>(g, s, w, d, row0); break;
    }
  }
}

}  // namespace tilemoe::kernels
