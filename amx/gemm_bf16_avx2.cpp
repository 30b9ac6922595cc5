// AVX2 GEMM for CPUs without AVX512-BF16 (AMD Zen 2 and 3; Intel Xeons before Cooper Lake): the
// same blocking as the AVX-512 kernel, with the bf16 products done in f32. Each 64-byte row of a
// packed block (16 columns × one k-pair) is two ymm loads; a k-pair's two values per column are the
// low and high halves of one 32-bit lane, so a shift and a mask make them f32 without a shuffle.
//
// Every element is computed as the portable kernel computes it, acc += x0*w0 + x1*w1 with each
// operation rounded on its own (no FMA): the avx2 table gives the portable table's bits, which the
// layer's bit-for-bit checks (f32 and bf16 factors, any thread count) rest on.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "amx/gemm_bf16.hpp"
#include "amx/pack_bf16.hpp"

namespace tilemoe::kernels {
namespace {

constexpr int kMaxRows = 4;
static_assert(kATileRows % kMaxRows == 0, "a row group must not cross a row tile of A in tile order");
// Registers: R rows × P panels × 2 halves accumulators, at most 8 of the 16 ymm. At one row, four
// panels are four memory streams and eight independent add chains.
constexpr int max_panels(int rows) { return rows == 1 ? 4 : rows == 2 ? 2 : 1; }
// Panels are grouped so that one group's weights stay in L2 while every row group passes over them.
constexpr std::size_t kGroupBytes = 256 * 1024;

inline __m256 low_half_f32(__m256i v) { return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)); }
inline __m256 high_half_f32(__m256i v) {
  return _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(static_cast<int>(0xFFFF0000u))));
}

// Eight bf16 values (any alignment) as eight f32.
inline __m256 widen8(const bf16* p) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16));
}

template <int R, int P>
inline void accumulate(__m256 (&acc)[R][P][2], ARows a, const bf16* panel0, std::size_t panel_stride, int kblocks) {
  // A's rows of one k-block as f32, so that each k-pair's values are broadcast straight from L1
  // (load ports) rather than built from bf16 with three vector ALU operations a row: at 4 rows
  // those were a quarter of the loop's ALU work.
  alignas(32) float x[R][kBlockK];
  for (int kb = 0; kb < kblocks; ++kb) {
    const bf16* block = panel0 + static_cast<std::size_t>(kb) * kBlockElements;
    const bf16* ak = a.p + static_cast<std::size_t>(kb) * a.kblock_stride;
#pragma GCC unroll 4
    for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
      for (int q = 0; q < kBlockK; q += 8) _mm256_store_ps(&x[i][q], widen8(ak + i * a.row_stride + q));
#pragma GCC unroll 4
    for (int r = 0; r < kBlockK / 2; ++r) {
      if constexpr (P == 1) {
        // One panel (3-4 rows): the k-pair's two weight rows held, each row's values broadcast in
        // turn; holding all rows' values instead would need 2 R registers and spill at 4 rows.
        const bf16* row = block + r * 32;
        __m256 w0[2], w1[2];
#pragma GCC unroll 2
        for (int h = 0; h < 2; ++h) {
          const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 16 * h));
          w0[h] = low_half_f32(w);
          w1[h] = high_half_f32(w);
        }
#pragma GCC unroll 4
        for (int i = 0; i < R; ++i) {
          const __m256 even = _mm256_broadcast_ss(&x[i][2 * r]), odd = _mm256_broadcast_ss(&x[i][2 * r + 1]);
#pragma GCC unroll 2
          for (int h = 0; h < 2; ++h) {
            const __m256 s = _mm256_add_ps(_mm256_mul_ps(even, w0[h]), _mm256_mul_ps(odd, w1[h]));
            acc[i][0][h] = _mm256_add_ps(acc[i][0][h], s);
          }
        }
      } else {
        // Several panels (1-2 rows): the rows' values held, each panel's weight rows loaded in turn.
        __m256 even[R], odd[R];
#pragma GCC unroll 4
        for (int i = 0; i < R; ++i) {
          even[i] = _mm256_broadcast_ss(&x[i][2 * r]);
          odd[i] = _mm256_broadcast_ss(&x[i][2 * r + 1]);
        }
#pragma GCC unroll 4
        for (int p = 0; p < P; ++p) {
          const bf16* row = block + p * panel_stride + r * 32;
#pragma GCC unroll 2
          for (int h = 0; h < 2; ++h) {
            const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 16 * h));
            const __m256 w0 = low_half_f32(w), w1 = high_half_f32(w);
#pragma GCC unroll 4
            for (int i = 0; i < R; ++i) {
              const __m256 s = _mm256_add_ps(_mm256_mul_ps(even[i], w0), _mm256_mul_ps(odd[i], w1));
              acc[i][p][h] = _mm256_add_ps(acc[i][p][h], s);
            }
          }
        }
      }
    }
  }
}

// R rows starting at row0 times P panels starting at panel (absolute index).
template <int R, int P>
void block(const GemmBf16Args& g, int row0, int panel) {
  const int kblocks = g.k_padded / kBlockK;
  __m256 acc[R][P][2];
  for (int i = 0; i < R; ++i)
    for (int p = 0; p < P; ++p) acc[i][p][0] = acc[i][p][1] = _mm256_setzero_ps();

  const std::size_t stride = static_cast<std::size_t>(kblocks) * kBlockElements;
  accumulate<R, P>(acc, a_rows(g, row0), g.packed_b + panel * stride, stride, kblocks);
  if (g.packed_b2 != nullptr && g.k2_padded > 0) {
    const int kblocks2 = g.k2_padded / kBlockK;
    const std::size_t stride2 = second_panel_stride(g.k2_padded, g.b2_panel_stride);
    accumulate<R, P>(acc, ARows{g.a2 + row0 * g.lda2, g.lda2, kBlockK}, g.packed_b2 + panel * stride2, stride2, kblocks2);
  }

  for (int i = 0; i < R; ++i) {
    float* ci = g.c + (row0 + i) * g.ldc + (panel - g.panel_begin) * kPanelColumns;
    for (int p = 0; p < P; ++p) {
      for (int h = 0; h < 2; ++h) {
        float* out = ci + p * kPanelColumns + 8 * h;
        __m256 v = acc[i][p][h];
        if (g.accumulate) v = _mm256_add_ps(_mm256_loadu_ps(out), v);
        _mm256_storeu_ps(out, v);
      }
    }
  }
}

using BlockFn = void (*)(const GemmBf16Args&, int, int);

// kBlocks[R - 1][P - 1]; P up to max_panels(R) (the rest repeat the widest).
constexpr BlockFn kBlocks[kMaxRows][4] = {
    {block<1, 1>, block<1, 2>, block<1, 3>, block<1, 4>},
    {block<2, 1>, block<2, 2>, block<2, 2>, block<2, 2>},
    {block<3, 1>, block<3, 1>, block<3, 1>, block<3, 1>},
    {block<4, 1>, block<4, 1>, block<4, 1>, block<4, 1>},
};

}  // namespace

void gemm_bf16_avx2(const GemmBf16Args& args) {
  // Sized by the main product's weights: a LoRA's few k-blocks of B would otherwise make the
  // groups one panel narrower.
  const std::size_t panel_bytes =
      static_cast<std::size_t>(args.k_padded > 0 ? args.k_padded : (args.packed_b2 != nullptr ? args.k2_padded : 0)) *
      kPanelColumns * sizeof(bf16);
  const int group = static_cast<int>(std::max<std::size_t>(4, panel_bytes == 0 ? 4 : kGroupBytes / panel_bytes));
  for (int g0 = args.panel_begin; g0 < args.panel_end; g0 += group) {
    const int g1 = std::min(args.panel_end, g0 + group);
    for (int row = 0; row < args.m; row += kMaxRows) {
      const int rows = std::min(kMaxRows, args.m - row);
      const int width = max_panels(rows);
      for (int p = g0; p < g1; p += width) kBlocks[rows - 1][std::min(width, g1 - p) - 1](args, row, p);
    }
  }
}

}  // namespace tilemoe::kernels
