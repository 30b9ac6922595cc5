// The integer GEMM on AVX2, for CPUs without AVX512-VNNI. A quad row of a packed block is 16
// columns × 4 k of codes, two ymm of 8 columns each; VPMADDUBSW then VPMADDWD sum a column's four
// products into one int32 lane. VPMADDUBSW multiplies unsigned by signed bytes:
//  - int8: the weight code goes in as |q| (128 for -128 is still right as unsigned) and the
//    activation code takes q's sign (|a| <= 127: no overflow); a pair of products is at most
//    2 * 128 * 127 < 2^15, so the 16-bit step never saturates.
//  - int4: the code is nibble - 8, so the nibble (0..15) goes in as it is and each group's sums
//    lose 8 * (the row's sum of a over the group), computed once a call: no sign or offset work
//    a quad row.
// The sums are exact and are scaled as the portable kernel scales them (per group, then by the
// row's scale, each multiply and add rounded on its own): the avx2 table gives the portable
// table's bits.
//
// Blocking as in the AVX-512 kernels: up to 4 rows, and at 1 or 2 rows 4 or 2 panels side by side;
// panels grouped so that a group's codes stay in L2 while every row group passes over them.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "amx/convert_bf16.hpp"
#include "amx/gemm_int.hpp"

namespace tilemoe::kernels {
namespace {

constexpr int kMaxRows = 4;  // rows that share each quad row's codes while it is in registers

// Quad rows 2j and 2j + 1 of a packed block as two ymm each, columns 0-7 and 8-15 (byte c*4 + p =
// Q[c][4r + p]): int8 codes, or int4 nibbles (the code plus 8; one 64-byte line holds both quad
// rows, the even one in the low nibbles).
template <int Bits>
inline void quad_row_pair(const std::uint8_t* block, int j, __m256i (&even)[2], __m256i (&odd)[2]) {
  if constexpr (Bits == 8) {
    for (int h = 0; h < 2; ++h) {
      even[h] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 2 * j * 64 + 32 * h));
      odd[h] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + (2 * j + 1) * 64 + 32 * h));
    }
  } else {
    const __m256i low = _mm256_set1_epi8(0x0f);
    for (int h = 0; h < 2; ++h) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + j * 64 + 32 * h));
      even[h] = _mm256_and_si256(v, low);
      odd[h] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
    }
  }
}

// acc[i][h] += the products of one quad row's codes w (16 columns) with row i's quad at a_quad[i].
template <int R, int Bits>
inline void add_quad_row(__m256i (&acc)[R][2], const __m256i (&w)[2], const std::int8_t* const (&a_quad)[R]) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i w_abs[2];
  if constexpr (Bits == 8) w_abs[0] = _mm256_abs_epi8(w[0]), w_abs[1] = _mm256_abs_epi8(w[1]);
#pragma GCC unroll 4
  for (int i = 0; i < R; ++i) {
    std::int32_t quad;
    std::memcpy(&quad, a_quad[i], 4);
    const __m256i a = _mm256_set1_epi32(quad);
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      __m256i pairs;
      if constexpr (Bits == 8)
        pairs = _mm256_maddubs_epi16(w_abs[h], _mm256_sign_epi8(a, w[h]));
      else
        pairs = _mm256_maddubs_epi16(w[h], a);
      acc[i][h] = _mm256_add_epi32(acc[i][h], _mm256_madd_epi16(pairs, ones));
    }
  }
}

// Rows row0 .. row0 + R - 1 against panels panel .. panel + P - 1. The k loop runs group by group
// (a scale group is a whole number of 8-quad half blocks: groups are multiples of 32 codes, int8's
// one group is k_padded), so no division or group test sits in the quad rows' loop. At one or two
// rows, several panels side by side keep several streams of codes in flight: one stream left a
// Zen 3 core waiting on its loads (int8 at 1 token: the loads held most of the kernel's samples).
// group_sums (int4): [row][group] sums of the rows' codes, for the nibbles' offset.
template <int R, int P, int Bits>
void block(const GemmIntArgs& g, int row0, int panel, const std::int32_t* group_sums) {
  const PackedIntShape& s = g.shape;
  constexpr int kHalfQuads = 8, kBlockQuads = kIntBlockK / 4;
  const int quads = s.k_padded / 4, group_quads = s.group / 4;
  const std::uint8_t* codes[P];
  for (int p = 0; p < P; ++p) codes[p] = g.b.codes + static_cast<std::size_t>(panel + p) * s.panel_bytes();
  __m256 sum[P][R][2];
  for (int p = 0; p < P; ++p)
    for (int i = 0; i < R; ++i) sum[p][i][0] = sum[p][i][1] = _mm256_setzero_ps();
  for (int grp = 0; grp < s.groups; ++grp) {
    __m256i acc[P][R][2];
    for (int p = 0; p < P; ++p)
      for (int i = 0; i < R; ++i) acc[p][i][0] = acc[p][i][1] = _mm256_setzero_si256();
    const int q_end = std::min(quads, (grp + 1) * group_quads);
    for (int q = grp * group_quads; q < q_end; q += kHalfQuads) {
      const std::size_t at = static_cast<std::size_t>(q / kBlockQuads) * s.block_bytes();
      const int half = (q % kBlockQuads) / kHalfQuads;
      const std::int8_t* a_at[R];
      for (int i = 0; i < R; ++i) a_at[i] = g.a + g.lda * static_cast<std::size_t>(row0 + i) + 4 * q;
#pragma GCC unroll 4
      for (int j = 0; j < kHalfQuads / 2; ++j) {
        const std::int8_t* a_even[R];
        const std::int8_t* a_odd[R];
        for (int i = 0; i < R; ++i) a_even[i] = a_at[i] + 8 * j, a_odd[i] = a_at[i] + 8 * j + 4;
#pragma GCC unroll 4
        for (int p = 0; p < P; ++p) {
          __m256i even[2], odd[2];
          quad_row_pair<Bits>(codes[p] + at, half * (kHalfQuads / 2) + j, even, odd);
          add_quad_row<R, Bits>(acc[p], even, a_even);
          add_quad_row<R, Bits>(acc[p], odd, a_odd);
        }
      }
    }
    for (int p = 0; p < P; ++p) {
      if constexpr (Bits == 4) {
        for (int i = 0; i < R; ++i) {
          const __m256i offset = _mm256_set1_epi32(8 * group_sums[static_cast<std::size_t>(row0 + i) * s.groups + grp]);
          acc[p][i][0] = _mm256_sub_epi32(acc[p][i][0], offset);
          acc[p][i][1] = _mm256_sub_epi32(acc[p][i][1], offset);
        }
      }
      const float* scales = g.b.scales + (static_cast<std::size_t>(panel + p) * s.groups + grp) * 16;
      for (int h = 0; h < 2; ++h) {
        const __m256 scale = _mm256_loadu_ps(scales + 8 * h);
        for (int i = 0; i < R; ++i) sum[p][i][h] = _mm256_add_ps(sum[p][i][h], _mm256_mul_ps(_mm256_cvtepi32_ps(acc[p][i][h]), scale));
      }
    }
  }
  for (int i = 0; i < R; ++i) {
    const __m256 row_scale = _mm256_set1_ps(g.a_scale[row0 + i]);
    for (int p = 0; p < P; ++p) {
      float* out = g.c + g.ldc * static_cast<std::size_t>(row0 + i) + (panel + p - g.panel_begin) * 16;
      for (int h = 0; h < 2; ++h) {
        __m256 v = _mm256_mul_ps(row_scale, sum[p][i][h]);
        if (g.accumulate) v = _mm256_add_ps(_mm256_loadu_ps(out + 8 * h), v);
        _mm256_storeu_ps(out + 8 * h, v);
      }
    }
  }
}

using BlockFn = void (*)(const GemmIntArgs&, int, int, const std::int32_t*);
constexpr int max_panels(int rows) { return rows == 1 ? 4 : rows == 2 ? 2 : 1; }

// kBlocks<Bits>[R - 1][P - 1]; P up to max_panels(R) (the rest repeat the widest).
template <int Bits>
constexpr BlockFn kBlocks[kMaxRows][4] = {
    {block<1, 1, Bits>, block<1, 2, Bits>, block<1, 3, Bits>, block<1, 4, Bits>},
    {block<2, 1, Bits>, block<2, 2, Bits>, block<2, 2, Bits>, block<2, 2, Bits>},
    {block<3, 1, Bits>, block<3, 1, Bits>, block<3, 1, Bits>, block<3, 1, Bits>},
    {block<4, 1, Bits>, block<4, 1, Bits>, block<4, 1, Bits>, block<4, 1, Bits>},
};

// Panels are grouped so that one group's codes stay in L2 while every row group passes over them.
constexpr std::size_t kGroupBytes = 256 * 1024;

template <int Bits>
void rows_by_groups(const GemmIntArgs& g, const std::int32_t* group_sums) {
  const std::size_t panel_bytes = std::max<std::size_t>(g.shape.panel_bytes(), 1);
  const int width = static_cast<int>(std::max<std::size_t>(4, kGroupBytes / panel_bytes));
  for (int p0 = g.panel_begin; p0 < g.panel_end; p0 += width) {
    const int p1 = std::min(g.panel_end, p0 + width);
    for (int row = 0; row < g.m; row += kMaxRows) {
      const int rows = std::min(kMaxRows, g.m - row);
      const int step = max_panels(rows);
      for (int p = p0; p < p1; p += step) kBlocks<Bits>[rows - 1][std::min(step, p1 - p) - 1](g, row, p, group_sums);
    }
  }
}

}  // namespace

void gemm_int_avx2(const GemmIntArgs& args) {
  const GemmIntArgs g = with_int_a_rows(args);
  if (g.m <= 0) return;
  if (g.shape.bits == 8) {
    rows_by_groups<8>(g, nullptr);
  } else {
    const PackedIntShape& s = g.shape;
    thread_local std::vector<std::int32_t> group_sums;
    group_sums.resize(static_cast<std::size_t>(g.m) * s.groups);  // every entry is written below
    // A call may cover only a few panels (decode splits an expert's columns over the threads), so
    // this pass over A is vectorised too. Groups are multiples of 32 codes, as is k_padded.
    const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
    for (int i = 0; i < g.m; ++i) {
      const std::int8_t* a = g.a + g.lda * static_cast<std::size_t>(i);
      for (int gi = 0; gi < s.groups; ++gi) {
        __m256i sum = _mm256_setzero_si256();
        for (int kk = gi * s.group; kk < std::min(s.k_padded, (gi + 1) * s.group); kk += 32) {
          const __m256i codes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + kk));
          sum = _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, codes), ones16));
        }
        alignas(32) std::int32_t lanes[8];
        _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), sum);
        group_sums[static_cast<std::size_t>(i) * s.groups + gi] =
            lanes[0] + lanes[1] + lanes[2] + lanes[3] + lanes[4] + lanes[5] + lanes[6] + lanes[7];
      }
    }
    rows_by_groups<4>(g, group_sums.data());
  }
  add_second_product(args, gemm_bf16_avx2);
  write_int_result_bf16(args, convert_to_bf16_avx2);
}

}  // namespace tilemoe::kernels
