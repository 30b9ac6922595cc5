#include "amx/lora_rows.hpp"

#include <vector>

namespace tilemoe::kernels {

void lora_project_rows(const bf16* v, std::size_t ldv, int rows, int in, const float* a, int rank, float scale, float* xa) {
  // Converting the row once keeps the inner loop a plain f32 dot product the compiler vectorises.
  thread_local std::vector<float> row;
  row.resize(static_cast<std::size_t>(in));
  for (int i = 0; i < rows; ++i) {
    const bf16* vi = v + static_cast<std::size_t>(i) * ldv;
    for (int k = 0; k < in; ++k) row[k] = bf16_to_float(vi[k]);
    for (int j = 0; j < rank; ++j) {
      const float* aj = a + static_cast<std::size_t>(j) * in;
      float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
      int k = 0;
      for (; k + 4 <= in; k += 4) {
        s0 += row[k] * aj[k];
        s1 += row[k + 1] * aj[k + 1];
        s2 += row[k + 2] * aj[k + 2];
        s3 += row[k + 3] * aj[k + 3];
      }
      for (; k < in; ++k) s0 += row[k] * aj[k];
      xa[static_cast<std::size_t>(i) * rank + j] = scale * ((s0 + s1) + (s2 + s3));
    }
  }
}

void lora_expand_rows_add(const float* xa, int rows, int rank, const float* b, int col0, int n, float* c, std::size_t ldc) {
  for (int i = 0; i < rows; ++i) {
    const float* x = xa + static_cast<std::size_t>(i) * rank;
    float* ci = c + static_cast<std::size_t>(i) * ldc;
    for (int j = 0; j < n; ++j) {
      const float* bj = b + static_cast<std::size_t>(col0 + j) * rank;
      float s = 0;
      for (int q = 0; q < rank; ++q) s += x[q] * bj[q];
      ci[j] += s;
    }
  }
}

}  // namespace tilemoe::kernels
