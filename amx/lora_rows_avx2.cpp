// LoRA for a few rows on AVX2 (lora_rows.hpp), for the layouts the forward uses (A and B with
// contiguous rows); any other layout goes to the portable loops. Each sum is formed in the
// portable loops' order, one multiply and one add at a time, so the bits are the portable ones:
//  - projection: the portable loop keeps four partial sums per output j (k mod 4), one dependent
//    add chain each; here a ymm holds the four partial sums of two outputs, and four ymm eight
//    outputs, so eight chains run side by side instead of one.
//  - expansion: the portable loop sums the rank terms of one output column in a chain; here eight
//    columns' chains run in the lanes of one ymm, B's 8 x 8 blocks transposed in registers.
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "amx/lora_rows.hpp"

namespace tilemoe::kernels {
namespace {

inline __m128 load4(const float* p) { return _mm_loadu_ps(p); }
inline __m128 load4(const bf16* p) {
  std::int64_t bits;
  std::memcpy(&bits, p, sizeof bits);
  return _mm_castsi128_ps(_mm_slli_epi32(_mm_cvtepu16_epi32(_mm_cvtsi64_si128(bits)), 16));
}
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const bf16* p) {
  const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
}

// Out[j] for the outputs [j0, j0 + 2 * P): ymm p holds outputs j0 + 2p (low lane half) and
// j0 + 2p + 1 (high half), each as the portable loop's partial sums s0..s3.
template <typename T, int P>
void project_outputs(const float* row, int in, const T* data, std::size_t row_stride, int j0, float scale, float* out) {
  __m256 s[P];
  for (int p = 0; p < P; ++p) s[p] = _mm256_setzero_ps();
  const T* a[2 * P];
  for (int t = 0; t < 2 * P; ++t) a[t] = data + static_cast<std::size_t>(j0 + t) * row_stride;
  int k = 0;
  for (; k + 4 <= in; k += 4) {
    const __m256 x = _mm256_broadcast_ps(reinterpret_cast<const __m128*>(row + k));
    for (int p = 0; p < P; ++p) {
      const __m256 w = _mm256_set_m128(load4(a[2 * p + 1] + k), load4(a[2 * p] + k));
      s[p] = _mm256_add_ps(s[p], _mm256_mul_ps(x, w));
    }
  }
  for (int p = 0; p < P; ++p) {
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, s[p]);
    for (int h = 0; h < 2; ++h) {
      float s0 = lanes[4 * h], s1 = lanes[4 * h + 1], s2 = lanes[4 * h + 2], s3 = lanes[4 * h + 3];
      for (int kk = k; kk < in; ++kk) s0 += row[kk] * factor_value(a[2 * p + h][kk]);
      out[j0 + 2 * p + h] = scale * ((s0 + s1) + (s2 + s3));
    }
  }
}

// The last output of an odd rank: the portable loop as it is (its four chains in one xmm).
template <typename T>
void project_output(const float* row, int in, const T* aj, float scale, float* out) {
  __m128 s = _mm_setzero_ps();
  int k = 0;
  for (; k + 4 <= in; k += 4) s = _mm_add_ps(s, _mm_mul_ps(_mm_loadu_ps(row + k), load4(aj + k)));
  alignas(16) float lanes[4];
  _mm_store_ps(lanes, s);
  float s0 = lanes[0];
  for (; k < in; ++k) s0 += row[k] * factor_value(aj[k]);
  *out = scale * ((s0 + lanes[1]) + (lanes[2] + lanes[3]));
}

template <typename T>
void project_rows(const bf16* v, std::size_t ldv, int rows, int in, StridedFactor a, int rank, float scale, float* xa, std::size_t ldxa) {
  thread_local std::vector<float> row;
  row.resize(static_cast<std::size_t>(in));
  const T* data = a.as<T>();
  for (int i = 0; i < rows; ++i) {
    const bf16* vi = v + static_cast<std::size_t>(i) * ldv;
    float* out = xa + static_cast<std::size_t>(i) * ldxa;
    for (int k = 0; k < in; ++k) row[k] = bf16_to_float(vi[k]);
    int j = 0;
    for (; j + 8 <= rank; j += 8) project_outputs<T, 4>(row.data(), in, data, a.row_stride, j, scale, out);
    for (; j + 2 <= rank; j += 2) project_outputs<T, 1>(row.data(), in, data, a.row_stride, j, scale, out);
    if (j < rank) project_output(row.data(), in, data + static_cast<std::size_t>(j) * a.row_stride, scale, out + j);
  }
}

inline void transpose8(__m256 (&r)[8]) {
  const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
  const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
  const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
  const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
  const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
  const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
  const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
  const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
  r[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
  r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
  r[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
  r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
  r[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
  r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
  r[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
  r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

constexpr int kExpandRows = 4;

// Columns [j0, j0 + 8) of R rows: lane t of s[i] is the portable loop's chain for column j0 + t.
template <typename T, int R>
void expand_columns(const float* xa, std::size_t ldxa, int rank, const T* data, std::size_t row_stride, int j0, float* c, std::size_t ldc) {
  __m256 s[R];
  for (int i = 0; i < R; ++i) s[i] = _mm256_setzero_ps();
  const T* b[8];
  for (int t = 0; t < 8; ++t) b[t] = data + static_cast<std::size_t>(j0 + t) * row_stride;
  int q0 = 0;
  for (; q0 + 8 <= rank; q0 += 8) {
    __m256 bq[8];
    for (int t = 0; t < 8; ++t) bq[t] = load8(b[t] + q0);
    transpose8(bq);  // bq[q] = b(j0 .. j0 + 7, q0 + q)
    for (int i = 0; i < R; ++i) {
      const float* x = xa + static_cast<std::size_t>(i) * ldxa + q0;
      for (int q = 0; q < 8; ++q) s[i] = _mm256_add_ps(s[i], _mm256_mul_ps(_mm256_set1_ps(x[q]), bq[q]));
    }
  }
  for (int q = q0; q < rank; ++q) {
    const __m256 bq = _mm256_setr_ps(factor_value(b[0][q]), factor_value(b[1][q]), factor_value(b[2][q]), factor_value(b[3][q]),
                                     factor_value(b[4][q]), factor_value(b[5][q]), factor_value(b[6][q]), factor_value(b[7][q]));
    for (int i = 0; i < R; ++i) s[i] = _mm256_add_ps(s[i], _mm256_mul_ps(_mm256_set1_ps(xa[static_cast<std::size_t>(i) * ldxa + q]), bq));
  }
  for (int i = 0; i < R; ++i) {
    float* ci = c + static_cast<std::size_t>(i) * ldc + j0;
    _mm256_storeu_ps(ci, _mm256_add_ps(_mm256_loadu_ps(ci), s[i]));
  }
}

template <typename T, int R>
void expand_row_group(const float* xa, std::size_t ldxa, int rank, const T* data, std::size_t row_stride, int col0, int n, float* c,
                      std::size_t ldc) {
  const T* columns = data + static_cast<std::size_t>(col0) * row_stride;
  int j = 0;
  for (; j + 8 <= n; j += 8) expand_columns<T, R>(xa, ldxa, rank, columns, row_stride, j, c, ldc);
  for (; j < n; ++j) {
    const T* bj = columns + static_cast<std::size_t>(j) * row_stride;
    for (int i = 0; i < R; ++i) {
      const float* x = xa + static_cast<std::size_t>(i) * ldxa;
      float s = 0;
      for (int q = 0; q < rank; ++q) s += x[q] * factor_value(bj[q]);
      c[static_cast<std::size_t>(i) * ldc + j] += s;
    }
  }
}

template <typename T>
void expand_rows_add(const float* xa, std::size_t ldxa, int rows, int rank, StridedFactor b, int col0, int n, float* c, std::size_t ldc) {
  const T* data = b.as<T>();
  int i = 0;
  for (; i + kExpandRows <= rows; i += kExpandRows)
    expand_row_group<T, kExpandRows>(xa + i * ldxa, ldxa, rank, data, b.row_stride, col0, n, c + i * ldc, ldc);
  for (; i < rows; ++i) expand_row_group<T, 1>(xa + i * ldxa, ldxa, rank, data, b.row_stride, col0, n, c + i * ldc, ldc);
}

}  // namespace

void lora_project_rows_avx2(const bf16* v, std::size_t ldv, int rows, int in, StridedFactor a, int rank, float scale, float* xa,
                            std::size_t ldxa) {
  if (a.col_stride != 1) return lora_project_rows_portable(v, ldv, rows, in, a, rank, scale, xa, ldxa);
  if (a.is_bf16()) return project_rows<bf16>(v, ldv, rows, in, a, rank, scale, xa, ldxa);
  project_rows<float>(v, ldv, rows, in, a, rank, scale, xa, ldxa);
}

void lora_expand_rows_add_avx2(const float* xa, std::size_t ldxa, int rows, int rank, StridedFactor b, int col0, int n, float* c,
                               std::size_t ldc) {
  if (b.col_stride != 1) return lora_expand_rows_add_portable(xa, ldxa, rows, rank, b, col0, n, c, ldc);
  if (b.is_bf16()) return expand_rows_add<bf16>(xa, ldxa, rows, rank, b, col0, n, c, ldc);
  expand_rows_add<float>(xa, ldxa, rows, rank, b, col0, n, c, ldc);
}

}  // namespace tilemoe::kernels
