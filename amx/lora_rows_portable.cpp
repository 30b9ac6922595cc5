#include "amx/lora_rows.hpp"

#include <algorithm>
#include <vector>

namespace tilemoe::kernels {

// Each loop runs along whichever index is contiguous in memory, so the compiler vectorises it:
// a dot product along k when A's rows are contiguous (forward), an axpy along j when its
// columns are (the backward's transposed factors).
void lora_project_rows_portable(const bf16* v, std::size_t ldv, int rows, int in, StridedF32 a, int rank, float scale, float* xa,
                       std::size_t ldxa) {
  thread_local std::vector<float> row;
  row.resize(static_cast<std::size_t>(in));
  for (int i = 0; i < rows; ++i) {
    const bf16* vi = v + static_cast<std::size_t>(i) * ldv;
    float* out = xa + static_cast<std::size_t>(i) * ldxa;
    for (int k = 0; k < in; ++k) row[k] = bf16_to_float(vi[k]);
    if (a.col_stride == 1) {
      for (int j = 0; j < rank; ++j) {
        const float* aj = a.data + static_cast<std::size_t>(j) * a.row_stride;
        float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        int k = 0;
        for (; k + 4 <= in; k += 4) {
          s0 += row[k] * aj[k];
          s1 += row[k + 1] * aj[k + 1];
          s2 += row[k + 2] * aj[k + 2];
          s3 += row[k + 3] * aj[k + 3];
        }
        for (; k < in; ++k) s0 += row[k] * aj[k];
        out[j] = scale * ((s0 + s1) + (s2 + s3));
      }
    } else {
      std::fill(out, out + rank, 0.0f);
      for (int k = 0; k < in; ++k) {
        const float x = row[k];
        const float* ak = a.data + static_cast<std::size_t>(k) * a.col_stride;
        if (a.row_stride == 1) {
          for (int j = 0; j < rank; ++j) out[j] += x * ak[j];
        } else {
          for (int j = 0; j < rank; ++j) out[j] += x * ak[static_cast<std::size_t>(j) * a.row_stride];
        }
      }
      for (int j = 0; j < rank; ++j) out[j] *= scale;
    }
  }
}

void lora_expand_rows_add_portable(const float* xa, std::size_t ldxa, int rows, int rank, StridedF32 b, int col0, int n, float* c,
                          std::size_t ldc) {
  for (int i = 0; i < rows; ++i) {
    const float* x = xa + static_cast<std::size_t>(i) * ldxa;
    float* ci = c + static_cast<std::size_t>(i) * ldc;
    if (b.col_stride == 1) {
      for (int j = 0; j < n; ++j) {
        const float* bj = b.data + static_cast<std::size_t>(col0 + j) * b.row_stride;
        float s = 0;
        for (int q = 0; q < rank; ++q) s += x[q] * bj[q];
        ci[j] += s;
      }
    } else {
      for (int q = 0; q < rank; ++q) {
        const float xq = x[q];
        const float* bq = b.data + static_cast<std::size_t>(q) * b.col_stride + static_cast<std::size_t>(col0) * b.row_stride;
        if (b.row_stride == 1) {
          for (int j = 0; j < n; ++j) ci[j] += xq * bq[j];
        } else {
          for (int j = 0; j < n; ++j) ci[j] += xq * bq[static_cast<std::size_t>(j) * b.row_stride];
        }
      }
    }
  }
}

}  // namespace tilemoe::kernels
