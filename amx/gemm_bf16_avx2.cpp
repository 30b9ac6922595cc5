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
#include <utility>

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

// The accumulators as a flat array indexed only by template constants (row i, half j = 2 p + h
// at [i * 2P + j]): GCC's scalar replacement then keeps them in registers. Indexed by loop
// variables, even fully unrolled ones, it kept the registers and also stored every one back to the
// stack at each k-pair.
template <int R, int P>
using Acc = __m256[R * P * 2];

// acc[I][J] += even * w0 + odd * w1, in the portable kernel's order of roundings.
inline __m256 add_pair(__m256 acc, __m256 even, __m256 odd, __m256 w0, __m256 w1) {
  return _mm256_add_ps(acc, _mm256_add_ps(_mm256_mul_ps(even, w0), _mm256_mul_ps(odd, w1)));
}

// One panel (3-4 rows): the k-pair's two weight rows held (four registers), each row's values
// broadcast in turn; holding every row's values instead needs 2R registers and spills at 4 rows.
template <int R, std::size_t... I>
inline void step_one_panel(Acc<R, 1>& acc, const float (&x)[R][kBlockK], int r, const bf16* row, std::index_sequence<I...>) {
  const __m256i wa = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row));
  const __m256i wb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 16));
  const __m256 a0 = low_half_f32(wa), a1 = high_half_f32(wa), b0 = low_half_f32(wb), b1 = high_half_f32(wb);
  (
      [&] {
        const __m256 even = _mm256_broadcast_ss(&x[I][2 * r]), odd = _mm256_broadcast_ss(&x[I][2 * r + 1]);
        acc[2 * I] = add_pair(acc[2 * I], even, odd, a0, a1);
        acc[2 * I + 1] = add_pair(acc[2 * I + 1], even, odd, b0, b1);
      }(),
      ...);
}

// One half of one panel (J = 2 p + h) for every row, the rows' values already broadcast.
template <int R, int P, int J, std::size_t... I>
inline void step_half(Acc<R, P>& acc, const __m256 (&even)[R], const __m256 (&odd)[R], const bf16* row, std::index_sequence<I...>) {
  const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row));
  const __m256 w0 = low_half_f32(w), w1 = high_half_f32(w);
  ((acc[I * 2 * P + J] = add_pair(acc[I * 2 * P + J], even[I], odd[I], w0, w1)), ...);
}

// Several panels (1-2 rows): the rows' values held, each panel's weight rows loaded in turn.
template <int R, int P, std::size_t... J>
inline void step_panels(Acc<R, P>& acc, const float (&x)[R][kBlockK], int r, const bf16* row0, std::size_t panel_stride,
                        std::index_sequence<J...>) {
  __m256 even[R], odd[R];
  for (int i = 0; i < R; ++i) {
    even[i] = _mm256_broadcast_ss(&x[i][2 * r]);
    odd[i] = _mm256_broadcast_ss(&x[i][2 * r + 1]);
  }
  (step_half<R, P, static_cast<int>(J)>(acc, even, odd, row0 + (J / 2) * panel_stride + (J % 2) * 16, std::make_index_sequence<R>{}),
   ...);
}

template <int R, int P>
inline void accumulate(Acc<R, P>& acc, ARows a, const bf16* panel0, std::size_t panel_stride, int kblocks) {
  // A's rows of one k-block as f32, so that each k-pair's values are broadcast straight from L1
  // (load ports) rather than built from bf16 with three vector ALU operations a row: at 4 rows
  // those were a quarter of the loop's ALU work.
  alignas(32) float x[R][kBlockK];
  for (int kb = 0; kb < kblocks; ++kb) {
    const bf16* block = panel0 + static_cast<std::size_t>(kb) * kBlockElements;
    const bf16* ak = a.p + static_cast<std::size_t>(kb) * a.kblock_stride;
    for (int i = 0; i < R; ++i)
      for (int q = 0; q < kBlockK; q += 8) _mm256_store_ps(&x[i][q], widen8(ak + i * a.row_stride + q));
#pragma GCC unroll 4
    for (int r = 0; r < kBlockK / 2; ++r) {
      if constexpr (P == 1)
        step_one_panel<R>(acc, x, r, block + r * 32, std::make_index_sequence<R>{});
      else
        step_panels<R, P>(acc, x, r, block + r * 32, panel_stride, std::make_index_sequence<2 * P>{});
    }
  }
}

// C's rows from the accumulators (J runs over all R x 2P of them, row-major).
template <int R, int P, std::size_t... J>
inline void store_c(const GemmBf16Args& g, int row0, int panel, const Acc<R, P>& acc, std::index_sequence<J...>) {
  float* c0 = g.c + row0 * g.ldc + (panel - g.panel_begin) * kPanelColumns;
  (
      [&] {
        float* out = c0 + (J / (2 * P)) * g.ldc + 8 * (J % (2 * P));
        __m256 v = acc[J];
        if (g.accumulate) v = _mm256_add_ps(_mm256_loadu_ps(out), v);
        _mm256_storeu_ps(out, v);
      }(),
      ...);
}

template <std::size_t... J>
inline void zero(__m256 (&acc)[sizeof...(J)], std::index_sequence<J...>) {
  ((acc[J] = _mm256_setzero_ps()), ...);
}

// R rows starting at row0 times P panels starting at panel (absolute index).
template <int R, int P>
void block(const GemmBf16Args& g, int row0, int panel) {
  const int kblocks = g.k_padded / kBlockK;
  Acc<R, P> acc;
  zero(acc, std::make_index_sequence<R * P * 2>{});

  const std::size_t stride = static_cast<std::size_t>(kblocks) * kBlockElements;
  accumulate<R, P>(acc, a_rows(g, row0), g.packed_b + panel * stride, stride, kblocks);
  if (g.packed_b2 != nullptr && g.k2_padded > 0) {
    const int kblocks2 = g.k2_padded / kBlockK;
    const std::size_t stride2 = second_panel_stride(g.k2_padded, g.b2_panel_stride);
    accumulate<R, P>(acc, ARows{g.a2 + row0 * g.lda2, g.lda2, kBlockK}, g.packed_b2 + panel * stride2, stride2, kblocks2);
  }
  store_c<R, P>(g, row0, panel, acc, std::make_index_sequence<R * P * 2>{});
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
