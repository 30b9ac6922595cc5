#pragma once
// LoRA for a few rows (decode), straight from the caller's f32 A and B: no packing, no copy.
// With one to a few tokens per expert, packing A and B for the tile kernels costs more than the
// product itself; these loops read A and B once and are done. The factors are read through
// strides, so the backward uses the same loops on Aᵀ and Bᵀ without transposing anything.
#include <cstddef>

#include "tilemoe/bf16.hpp"

namespace tilemoe::kernels {

// Element (r, c) of an f32 matrix is data[r * row_stride + c * col_stride].
struct StridedF32 {
  const float* data = nullptr;
  std::size_t row_stride = 0, col_stride = 1;

  float at(int r, int c) const { return data[static_cast<std::size_t>(r) * row_stride + static_cast<std::size_t>(c) * col_stride]; }
  StridedF32 transposed() const { return {data, col_stride, row_stride}; }
};

// xa[i][j] = scale * sum_k v[i][k] * a(j, k) for j < rank, k < in; v: bf16 [rows][ldv], xa: [rows][ldxa].
void lora_project_rows(const bf16* v, std::size_t ldv, int rows, int in, StridedF32 a, int rank, float scale, float* xa,
                       std::size_t ldxa);

// c[i][j] += sum_q xa[i][q] * b(col0 + j, q) for j < n, q < rank.
void lora_expand_rows_add(const float* xa, std::size_t ldxa, int rows, int rank, StridedF32 b, int col0, int n, float* c,
                          std::size_t ldc);

}  // namespace tilemoe::kernels
