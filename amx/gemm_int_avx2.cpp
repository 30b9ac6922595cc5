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

// Quad row r of a packed block as two ymm, columns 0-7 and 8-15 (byte c*4 + p = Q[c][4r + p]):
// int8 codes, or int4 nibbles (the code plus 8).
template <int Bits>
inline void quad_row(const std::uint8_t* block, int r, __m256i (&w)[2]) {
  if constexpr (Bits == 8) {
    w[0] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + r * 64));
    w[1] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + r * 64 + 32));
  } else {
    const std::uint8_t* raw = block + (r / 2) * 64;
    const __m256i low = _mm256_set1_epi8(0x0f);
    for (int h = 0; h < 2; ++h) {
      __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(raw + 32 * h));
      if (r & 1) v = _mm256_srli_epi16(v, 4);
      w[h] = _mm256_and_si256(v, low);
    }
  }
}

// group_sums (int4): [row][group] sums of the rows' codes, for the nibbles' offset.
template <int R, int Bits>
void row_group(const GemmIntArgs& g, int row0, const std::int32_t* group_sums) {
  const PackedIntShape& s = g.shape;
  const __m256i ones = _mm256_set1_epi16(1);
  for (int nb = g.panel_begin; nb < g.panel_end; ++nb) {
    const std::uint8_t* panel = g.b.codes + static_cast<std::size_t>(nb) * s.panel_bytes();
    const float* scales = g.b.scales + static_cast<std::size_t>(nb) * s.groups * 16;
    __m256 sum[R][2];
    __m256i acc[R][2];
    for (int i = 0; i < R; ++i) {
      sum[i][0] = sum[i][1] = _mm256_setzero_ps();
      acc[i][0] = acc[i][1] = _mm256_setzero_si256();
    }
    int group = 0;
    auto flush = [&] {
      for (int i = 0; i < R; ++i) {
        if constexpr (Bits == 4) {
          const __m256i offset = _mm256_set1_epi32(8 * group_sums[static_cast<std::size_t>(row0 + i) * s.groups + group]);
          acc[i][0] = _mm256_sub_epi32(acc[i][0], offset);
          acc[i][1] = _mm256_sub_epi32(acc[i][1], offset);
        }
      }
      for (int h = 0; h < 2; ++h) {
        const __m256 scale = _mm256_loadu_ps(scales + group * 16 + 8 * h);
        for (int i = 0; i < R; ++i) {
          sum[i][h] = _mm256_add_ps(sum[i][h], _mm256_mul_ps(_mm256_cvtepi32_ps(acc[i][h]), scale));
          acc[i][h] = _mm256_setzero_si256();
        }
      }
    };
    const std::int8_t* a_rows[R];
    for (int i = 0; i < R; ++i) a_rows[i] = g.a + g.lda * static_cast<std::size_t>(row0 + i);
    for (int kb = 0; kb < s.kblocks; ++kb) {
      const std::uint8_t* block = panel + static_cast<std::size_t>(kb) * s.block_bytes();
      for (int r = 0; r < 16; ++r) {
        const int quad_group = (kb * kIntBlockK + 4 * r) / s.group;  // groups hold whole quads
        if (quad_group != group) {
          flush();
          group = quad_group;
        }
        __m256i w[2];
        quad_row<Bits>(block, r, w);
        __m256i w_abs[2];
        if constexpr (Bits == 8) w_abs[0] = _mm256_abs_epi8(w[0]), w_abs[1] = _mm256_abs_epi8(w[1]);
        for (int i = 0; i < R; ++i) {
          std::int32_t quad;
          std::memcpy(&quad, a_rows[i] + kb * kIntBlockK + 4 * r, 4);
          const __m256i a = _mm256_set1_epi32(quad);
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
    }
    flush();
    for (int i = 0; i < R; ++i) {
      const __m256 row_scale = _mm256_set1_ps(g.a_scale[row0 + i]);
      float* out = g.c + g.ldc * static_cast<std::size_t>(row0 + i) + (nb - g.panel_begin) * 16;
      for (int h = 0; h < 2; ++h) {
        __m256 v = _mm256_mul_ps(row_scale, sum[i][h]);
        if (g.accumulate) v = _mm256_add_ps(_mm256_loadu_ps(out + 8 * h), v);
        _mm256_storeu_ps(out + 8 * h, v);
      }
    }
  }
}

template <int Bits>
void rows_by_groups(const GemmIntArgs& g, const std::int32_t* group_sums) {
  int row = 0;
  for (; row + kMaxRows <= g.m; row += kMaxRows) row_group<kMaxRows, Bits>(g, row, group_sums);
  switch (g.m - row) {
    case 3: row_group<3, Bits>(g, row, group_sums); break;
    case 2: row_group<2, Bits>(g, row, group_sums); break;
    case 1: row_group<1, Bits>(g, row, group_sums); break;
    default: break;
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
