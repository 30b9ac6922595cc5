// LoRA for a few rows with AVX-512, straight from the caller's factors (f32 or bf16, widened to
// f32 as they are loaded; the arithmetic is the same for both).
//
// Project, A by rows (a(j, k) contiguous along k, the forward): blocks of 4 rows of v (widened to
// f32 once) × 4 rows of A, 16 accumulators reduced once per block, so v is read rank/4 times
// and A rows/4 times (one accumulator per row re-read all of v for every j). Without
// this the compiler keeps the portable loop's dot products scalar (it may not reorder an f32
// sum), which made the LoRA of a 12-row expert cost as much as its share of the GEMM.
// Project, A by columns (a(j, k) contiguous along j, the backward's transposed factors): an
// axpy of v[i][k] into 16 j's at a time, for up to 4 rows at once.
// Expand, B by rows (b(col, q) contiguous along q, the forward): B's columns for the call are
// transposed once into a buffer (16 x 16 blocks in registers) so that each row is an axpy of
// xa[i][q] over 16 columns at a time.
// Expand, B by columns: the same axpy, read in place.
#include "amx/immintrin_gcc12.hpp"

#include <algorithm>
#include <vector>

#include "amx/bf16_avx512.hpp"
#include "amx/lora_rows.hpp"
#include "amx/transpose_avx512.hpp"

namespace tilemoe::kernels {
namespace {

constexpr int kRowGroup = 4;  // rows of v and
constexpr int kJGroup = 4;    // rows of A per block: 16 accumulators

// Rows of v widened to f32, each padded with zeros to a multiple of 16.
void widen_rows(const bf16* v, std::size_t ldv, int rows, int in, int in16, std::vector<float>& out) {
  out.resize(static_cast<std::size_t>(rows) * in16);
  for (int i = 0; i < rows; ++i) {
    const bf16* vi = v + static_cast<std::size_t>(i) * ldv;
    float* o = out.data() + static_cast<std::size_t>(i) * in16;
    for (int k = 0; k < in16; k += 16) _mm512_storeu_ps(o + k, load_f32x16(vi + k, lanes16(in - k)));
  }
}

// R rows × J consecutive j's of xa: each 16-float load of v serves J products, each load of A R.
template <int R, int J, typename T>
void project_block(const float* vf, int in, int in16, const T* const* aj, float scale, float* xa, std::size_t ldxa) {
  const __mmask16 last = lanes16(in - (in16 - 16));
  __m512 acc[R][J];
  for (int r = 0; r < R; ++r)
    for (int q = 0; q < J; ++q) acc[r][q] = _mm512_setzero_ps();
  for (int k = 0; k < in16; k += 16) {
    __m512 av[J];
    for (int q = 0; q < J; ++q) av[q] = load_f32x16(aj[q] + k, k + 16 <= in ? static_cast<__mmask16>(0xffff) : last);
    for (int r = 0; r < R; ++r) {
      const __m512 x = _mm512_loadu_ps(vf + static_cast<std::size_t>(r) * in16 + k);
      for (int q = 0; q < J; ++q) acc[r][q] = _mm512_fmadd_ps(x, av[q], acc[r][q]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int q = 0; q < J; ++q) xa[static_cast<std::size_t>(r) * ldxa + q] = scale * _mm512_reduce_add_ps(acc[r][q]);
}

template <int R, typename T>
void project_by_rows(const float* vf, int in, int in16, StridedFactor a, int rank, float scale, float* xa, std::size_t ldxa) {
  for (int j = 0; j < rank; j += kJGroup) {
    const T* aj[kJGroup];
    const int count = std::min(kJGroup, rank - j);
    for (int q = 0; q < count; ++q) aj[q] = a.as<T>() + static_cast<std::size_t>(j + q) * a.row_stride;
    switch (count) {
      case 4: project_block<R, 4, T>(vf, in, in16, aj, scale, xa + j, ldxa); break;
      case 3: project_block<R, 3, T>(vf, in, in16, aj, scale, xa + j, ldxa); break;
      case 2: project_block<R, 2, T>(vf, in, in16, aj, scale, xa + j, ldxa); break;
      default: project_block<R, 1, T>(vf, in, in16, aj, scale, xa + j, ldxa); break;
    }
  }
}

// t[q][j] = src[j][q] for j < n, q < rank, in 16 x 16 blocks through registers. The element by
// element copy it replaces took most of the expand's time: 6-14 ns a column at rank 16 against
// 1.4-5.6 with this, one row, 64-256 columns, on Zen 5 (at decode the forward expands about
// 29,000 columns of V2-Lite's LoRA B per layer call). Columns [n, round16(n)) of t get zeros;
// src is not read past row n - 1 or column rank - 1.
template <typename T>
void transpose_rows_to(const T* src, std::size_t lds, int n, int rank, float* t, std::size_t ldt) {
  for (int j0 = 0; j0 < n; j0 += 16) {
    const int rows = std::min(16, n - j0);
    for (int q0 = 0; q0 < rank; q0 += 16) {
      const __mmask16 lanes = lanes16(rank - q0);
      __m512 x[16];
      for (int r = 0; r < 16; ++r)
        x[r] = r < rows ? load_f32x16(src + static_cast<std::size_t>(j0 + r) * lds + q0, lanes) : _mm512_setzero_ps();
      transpose16(x);
      const int count = std::min(16, rank - q0);
      for (int c = 0; c < count; ++c) _mm512_storeu_ps(t + static_cast<std::size_t>(q0 + c) * ldt + j0, x[c]);
    }
  }
}

// The axpy form of the projection, for R rows and 16 j's from j0: a(j, k) = a[k * col_stride + j].
// Each load of A's row k serves the R rows, and each row keeps two partial sums (even and odd k):
// with one sum a row, every FMA waited for the one before (2048 of them a row at hidden 2048,
// rank 16), which made the backward's down dP at 12 rows an expert take most of its prep phase.
template <int R, typename T>
void project_columns_block(const float* vf, std::size_t ldvf, int in, const T* a, std::size_t col_stride, __mmask16 mask, float scale,
                           float* xa, std::size_t ldxa) {
  __m512 even[R], odd[R];
  for (int r = 0; r < R; ++r) even[r] = odd[r] = _mm512_setzero_ps();
  int k = 0;
  for (; k + 1 < in; k += 2) {
    const __m512 a0 = load_f32x16(a + static_cast<std::size_t>(k) * col_stride, mask);
    const __m512 a1 = load_f32x16(a + static_cast<std::size_t>(k + 1) * col_stride, mask);
    for (int r = 0; r < R; ++r) {
      const float* vr = vf + static_cast<std::size_t>(r) * ldvf + k;
      even[r] = _mm512_fmadd_ps(_mm512_set1_ps(vr[0]), a0, even[r]);
      odd[r] = _mm512_fmadd_ps(_mm512_set1_ps(vr[1]), a1, odd[r]);
    }
  }
  if (k < in) {
    const __m512 a0 = load_f32x16(a + static_cast<std::size_t>(k) * col_stride, mask);
    for (int r = 0; r < R; ++r) even[r] = _mm512_fmadd_ps(_mm512_set1_ps(vf[static_cast<std::size_t>(r) * ldvf + k]), a0, even[r]);
  }
  for (int r = 0; r < R; ++r)
    _mm512_mask_storeu_ps(xa + static_cast<std::size_t>(r) * ldxa, mask, _mm512_mul_ps(_mm512_set1_ps(scale), _mm512_add_ps(even[r], odd[r])));
}

template <typename T>
void project_by_columns(const float* vf, int rows, int in, int in16, StridedFactor a, int rank, float scale, float* xa, std::size_t ldxa) {
  const std::size_t ldvf = static_cast<std::size_t>(in16);
  for (int j0 = 0; j0 < rank; j0 += 16) {
    const __mmask16 mask = lanes16(rank - j0);
    const T* aj = a.as<T>() + j0;
    for (int i = 0; i < rows; i += kRowGroup) {
      const float* vi = vf + static_cast<std::size_t>(i) * ldvf;
      float* out = xa + static_cast<std::size_t>(i) * ldxa + j0;
      switch (std::min(kRowGroup, rows - i)) {
        case 4: project_columns_block<4, T>(vi, ldvf, in, aj, a.col_stride, mask, scale, out, ldxa); break;
        case 3: project_columns_block<3, T>(vi, ldvf, in, aj, a.col_stride, mask, scale, out, ldxa); break;
        case 2: project_columns_block<2, T>(vi, ldvf, in, aj, a.col_stride, mask, scale, out, ldxa); break;
        default: project_columns_block<1, T>(vi, ldvf, in, aj, a.col_stride, mask, scale, out, ldxa); break;
      }
    }
  }
}

template <typename T>
void project(const bf16* v, std::size_t ldv, int rows, int in, StridedFactor a, int rank, float scale, float* xa, std::size_t ldxa) {
  const int in16 = (std::max(in, 1) + 15) / 16 * 16;
  thread_local std::vector<float> vf;
  widen_rows(v, ldv, rows, in, in16, vf);
  if (a.col_stride != 1) return project_by_columns<T>(vf.data(), rows, in, in16, a, rank, scale, xa, ldxa);
  for (int i = 0; i < rows; i += kRowGroup) {
    const float* vi = vf.data() + static_cast<std::size_t>(i) * in16;
    float* out = xa + static_cast<std::size_t>(i) * ldxa;
    switch (std::min(kRowGroup, rows - i)) {
      case 4: project_by_rows<4, T>(vi, in, in16, a, rank, scale, out, ldxa); break;
      case 3: project_by_rows<3, T>(vi, in, in16, a, rank, scale, out, ldxa); break;
      case 2: project_by_rows<2, T>(vi, in, in16, a, rank, scale, out, ldxa); break;
      default: project_by_rows<1, T>(vi, in, in16, a, rank, scale, out, ldxa); break;
    }
  }
}

// c[i][j] += sum_q x[i][q] * bt[q][j], bt contiguous along j.
template <typename T>
void expand_add(const float* xa, std::size_t ldxa, int rows, int rank, const T* bt, std::size_t ldbt, int n, float* c, std::size_t ldc) {
  for (int i = 0; i < rows; ++i) {
    const float* x = xa + static_cast<std::size_t>(i) * ldxa;
    float* ci = c + static_cast<std::size_t>(i) * ldc;
    for (int j = 0; j < n; j += 16) {
      const __mmask16 mask = lanes16(n - j);
      __m512 acc = _mm512_maskz_loadu_ps(mask, ci + j);
      for (int q = 0; q < rank; ++q)
        acc = _mm512_fmadd_ps(_mm512_set1_ps(x[q]), load_f32x16(bt + static_cast<std::size_t>(q) * ldbt + j, mask), acc);
      _mm512_mask_storeu_ps(ci + j, mask, acc);
    }
  }
}

template <typename T>
void expand(const float* xa, std::size_t ldxa, int rows, int rank, StridedFactor b, int col0, int n, float* c, std::size_t ldc) {
  const T* first = b.as<T>() + static_cast<std::size_t>(col0) * b.row_stride;
  // bt[q][j] = b(col0 + j, q), contiguous along j: read in place when B is by columns.
  if (b.col_stride != 1) return expand_add(xa, ldxa, rows, rank, first, b.col_stride, n, c, ldc);
  thread_local std::vector<float> transposed;
  const std::size_t ldbt = static_cast<std::size_t>((n + 15) / 16 * 16);
  transposed.resize(static_cast<std::size_t>(rank) * ldbt);
  transpose_rows_to(first, b.row_stride, n, rank, transposed.data(), ldbt);
  expand_add(xa, ldxa, rows, rank, transposed.data(), ldbt, n, c, ldc);
}

}  // namespace

void lora_project_rows_avx512(const bf16* v, std::size_t ldv, int rows, int in, StridedFactor a, int rank, float scale, float* xa,
                              std::size_t ldxa) {
  if (rows <= 0 || rank <= 0) return;
  if (a.col_stride != 1 && a.row_stride != 1) return lora_project_rows_portable(v, ldv, rows, in, a, rank, scale, xa, ldxa);
  if (a.is_bf16()) return project<bf16>(v, ldv, rows, in, a, rank, scale, xa, ldxa);
  project<float>(v, ldv, rows, in, a, rank, scale, xa, ldxa);
}

void lora_expand_rows_add_avx512(const float* xa, std::size_t ldxa, int rows, int rank, StridedFactor b, int col0, int n, float* c,
                                 std::size_t ldc) {
  if (rows <= 0 || rank <= 0 || n <= 0) return;
  if (b.col_stride != 1 && b.row_stride != 1) return lora_expand_rows_add_portable(xa, ldxa, rows, rank, b, col0, n, c, ldc);
  if (b.is_bf16()) return expand<bf16>(xa, ldxa, rows, rank, b, col0, n, c, ldc);
  expand<float>(xa, ldxa, rows, rank, b, col0, n, c, ldc);
}

}  // namespace tilemoe::kernels
