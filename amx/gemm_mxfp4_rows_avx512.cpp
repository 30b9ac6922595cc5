// MXFP4 decode rows with AVX-512: the bf16 kernel's register blocking (gemm_bf16_avx512.cpp: a
// k-pair of each A row broadcast, one _mm512_dpbf16_ps per 16 columns x 2 k), fed by rows of
// E2M1 values looked up in registers from the packed code lines (pack_mxfp4.hpp: one 64-byte line,
// shifted by 0, 4, 8 and 12 bits, is four rows of a block after one VPERMW each). The group's
// power of two is not put into the values (that takes a zero test and a masked add per row, on
// the shuffle port the lookups need): a block's products go into their own sums, which are then
// multiplied by 2^(e - 127) as f32, exactly, and added to the row's. The weights stream at 4.25
// bits each and never exist as bf16 in memory. Each panel stream asks for its codes two blocks
// (8 lines) ahead.
#include "amx/immintrin_gcc12.hpp"

#include <cstdint>
#include <cstring>

#include "amx/gemm_mxfp4.hpp"
#include "amx/mxfp4_lookup_avx512.hpp"

namespace tilemoe::kernels {
namespace {

constexpr int kMaxRows = kMxfp4RowsMaxRows;
constexpr int kPrefetchBlocks = 2;

// Panels a block call reads at once: four streams where the registers allow (a row's sums and its
// block's sums for each panel), two for three and four rows.
template <int R>
constexpr int kPanelsFor = R <= 2 ? 4 : 2;

inline __m512i broadcast_pair(const bf16* p) {
  std::int32_t v;
  std::memcpy(&v, p, sizeof v);
  return _mm512_set1_epi32(v);
}

struct Decoder : Mxfp4LineLookup {
  __m512i least_scale = _mm512_set1_epi32(0x00400000);  // 2^-127, E8M0's exponent 0, as an f32 subnormal

  // 2^(e - 127) as f32 for each column's exponent e (exponent 255, not a number in E8M0, gives
  // infinity: pack_mxfp4.hpp leaves exponents outside its range unspecified).
  __m512 scales(const std::uint8_t* exponents) const {
    const __m512i e = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(exponents)));
    return _mm512_castsi512_ps(_mm512_max_epu32(_mm512_slli_epi32(e, 23), least_scale));
  }
};

template <int R, int P>
__attribute__((noinline)) void block(const GemmBf16Args& g, const PackedMxfp4Shape& s, const PackedMxfp4View& w, const Decoder& d, int row0, int panel) {
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
    const bf16* ak = a0 + static_cast<std::size_t>(kb) * kBlockK;
    __m512 part[R][P];
#pragma GCC unroll 4
    for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
      for (int p = 0; p < P; ++p) part[i][p] = _mm512_setzero_ps();
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      __m512i line[P];
#pragma GCC unroll 4
      for (int p = 0; p < P; ++p) {
        const std::uint8_t* line_at = codes + p * code_stride + j * 64;
        _mm_prefetch(reinterpret_cast<const char*>(line_at + kPrefetchBlocks * kMxfp4BlockCodeBytes), _MM_HINT_T0);
        line[p] = _mm512_loadu_si512(line_at);
      }
      // One row of every panel at a time, so a row's broadcast serves all P panels and the
      // registers hold P rows, not 4 P.
#pragma GCC unroll 4
      for (int t = 0; t < 4; ++t) {
        __m512i row[P];
#pragma GCC unroll 4
        for (int p = 0; p < P; ++p) row[p] = d.row(line[p], t);
#pragma GCC unroll 4
        for (int i = 0; i < R; ++i) {
          const __m512bh x = (__m512bh)broadcast_pair(ak + i * g.lda + 8 * j + 2 * t);
#pragma GCC unroll 4
          for (int p = 0; p < P; ++p) part[i][p] = _mm512_dpbf16_ps(part[i][p], x, (__m512bh)row[p]);
        }
      }
    }
    const std::uint8_t* exponents = exponents0 + static_cast<std::size_t>(kb) * kMxfp4BlockExponentBytes;
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) {
      const __m512 scale = d.scales(exponents + p * exponent_stride);
#pragma GCC unroll 4
      for (int i = 0; i < R; ++i) acc[i][p] = _mm512_fmadd_ps(part[i][p], scale, acc[i][p]);
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
  constexpr int kPanels = kPanelsFor<R>;
  int panel = g.panel_begin;
  for (; panel + kPanels <= g.panel_end; panel += kPanels) block<R, kPanels>(g, s, w, d, row0, panel);
  if constexpr (kPanels == 4) {
    switch (g.panel_end - panel) {
      case 3: block<R, 3>(g, s, w, d, row0, panel); break;
      case 2: block<R, 2>(g, s, w, d, row0, panel); break;
      case 1: block<R, 1>(g, s, w, d, row0, panel); break;
      default: break;
    }
  } else if (panel < g.panel_end) {
    block<R, 1>(g, s, w, d, row0, panel);
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
