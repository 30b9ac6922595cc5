#include "amx/lora_rows.hpp"

#include <algorithm>
#include <vector>

namespace tilemoe::kernels {
namespace {

// Each loop runs along whichever index is contiguous in memory, so the compiler vectorises it:
// a dot product along k when A's rows are contiguous (forward), an axpy along j when its
// columns are (the backward's transposed factors). T: the factor's storage (float or bf16).
template <typename T>
void project_rows(const bf16* v, std::size_t ldv, int rows, int in, StridedFactor a, int rank, float scale, float* xa, std::size_t ldxa) {
  thread_local std::vector<float> row;
  row.resize(static_cast<std::size_t>(in));
  const T* data = a.as<T>();
  for (int i = 0; i < rows; ++i) {
    const bf16* vi = v + static_cast<std::size_t>(i) * ldv;
    float* out = xa + static_cast<std::size_t>(i) * ldxa;
    for (int k = 0; k < in; ++k) row[k] = bf16_to_float(vi[k]);
    if (a.col_stride == 1) {
      for (int j = 0; j < rank; ++j) {
        const T* aj = data + static_cast<std::size_t>(j) * a.row_stride;
        float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        int k = 0;
        for (; k + 4 <= in; k += 4) {
          s0 += row[k] * factor_value(aj[k]);
          s1 += row[k + 1] * factor_value(aj[k + 1]);
          s2 += row[k + 2] * factor_value(aj[k + 2]);
          s3 += row[k + 3] * factor_value(aj[k + 3]);
        }
        for (; k < in; ++k) s0 += row[k] * factor_value(aj[k]);
        out[j] = scale * ((s0 + s1) + (s2 + s3));
      }
    } else {
      std::fill(out, out + rank, 0.0f);
      for (int k = 0; k < in; ++k) {
        const float x = row[k];
        const T* ak = data + static_cast<std::size_t>(k) * a.col_stride;
        if (a.row_stride == 1) {
          for (int j = 0; j < rank; ++j) out[j] += x * factor_value(ak[j]);
        } else {
          for (int j = 0; j < rank; ++j) out[j] += x * factor_value(ak[static_cast<std::size_t>(j) * a.row_stride]);
        }
      }
      for (int j = 0; j < rank; ++j) out[j] *= scale;
    }
  }
}

template <typename T>
void expand_rows_add(const float* xa, std::size_t ldxa, int rows, int rank, StridedFactor b, int col0, int n, float* c, std::size_t ldc) {
  const T* data = b.as<T>();
  for (int i = 0; i < rows; ++i) {
    const float* x = xa + static_cast<std::size_t>(i) * ldxa;
    float* ci = c + static_cast<std::size_t>(i) * ldc;
    if (b.col_stride == 1) {
      for (int j = 0; j < n; ++j) {
        const T* bj = data + static_cast<std::size_t>(col0 + j) * b.row_stride;
        float s = 0;
        for (int q = 0; q < rank; ++q) s += x[q] * factor_value(bj[q]);
        ci[j] += s;
      }
    } else {
      for (int q = 0; q < rank; ++q) {
        const float xq = x[q];
        const T* bq = data + static_cast<std::size_t>(q) * b.col_stride + static_cast<std::size_t>(col0) * b.row_stride;
        if (b.row_stride == 1) {
          for (int j = 0; j < n; ++j) ci[j] += xq * factor_value(bq[j]);
        } else {
          for (int j = 0; j < n; ++j) ci[j] += xq * factor_value(bq[static_cast<std::size_t>(j) * b.row_stride]);
        }
      }
    }
  }
}

}  // namespace

void lora_project_rows_portable(const bf16* v, std::size_t ldv, int rows, int in, StridedFactor a, int rank, float scale, float* xa,
                                std::size_t ldxa) {
  if (a.is_bf16()) return project_rows<bf16>(v, ldv, rows, in, a, rank, scale, xa, ldxa);
  project_rows<float>(v, ldv, rows, in, a, rank, scale, xa, ldxa);
}

void lora_expand_rows_add_portable(const float* xa, std::size_t ldxa, int rows, int rank, StridedFactor b, int col0, int n, float* c,
                                   std::size_t ldc) {
  if (b.is_bf16()) return expand_rows_add<bf16>(xa, ldxa, rows, rank, b, col0, n, c, ldc);
  expand_rows_add<float>(xa, ldxa, rows, rank, b, col0, n, c, ldc);
}

}  // namespace tilemoe::kernels
