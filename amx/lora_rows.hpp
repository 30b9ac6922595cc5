#pragma once
// LoRA for a few rows (decode), straight from the caller's f32 A and B: no packing, no copy.
// With one to a few tokens per expert, packing A and B for the tile kernels costs more than the
// product itself; these loops read A and B once and are done.
#include <cstddef>

#include "tilemoe/bf16.hpp"

namespace tilemoe::kernels {

// xa[i][j] = scale * sum_k v[i][k] * a[j][k]; v: bf16 [rows][ldv], a: f32 [rank][in].
void lora_project_rows(const bf16* v, std::size_t ldv, int rows, int in, const float* a, int rank, float scale, float* xa);

// c[i][j] += sum_q xa[i][q] * b[(col0 + j) * rank + q] for j < n; b: f32 [out][rank].
void lora_expand_rows_add(const float* xa, int rows, int rank, const float* b, int col0, int n, float* c, std::size_t ldc);

}  // namespace tilemoe::kernels
