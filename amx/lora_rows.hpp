#pragma once
// LoRA for a few rows (decode), straight from the caller's A and B (f32 or bf16): no packing, no copy.
// With one to a few tokens per expert, packing A and B for the tile kernels costs more than the
// product itself; these loops read A and B once and are done. The factors are read through
// strides, so the backward uses the same loops on Aᵀ and Bᵀ without transposing anything.
#include <cstddef>

#include "amx/strided_factor.hpp"
#include "tilemoe/bf16.hpp"

namespace tilemoe::kernels {

// xa[i][j] = scale * sum_k v[i][k] * a(j, k) for j < rank, k < in; v: bf16 [rows][ldv], xa: [rows][ldxa].
using LoraProjectRowsFn = void (*)(const bf16* v, std::size_t ldv, int rows, int in, StridedFactor a, int rank, float scale, float* xa,
                                   std::size_t ldxa);
// c[i][j] += sum_q xa[i][q] * b(col0 + j, q) for j < n, q < rank.
using LoraExpandRowsAddFn = void (*)(const float* xa, std::size_t ldxa, int rows, int rank, StridedFactor b, int col0, int n, float* c,
                                     std::size_t ldc);

void lora_project_rows_portable(const bf16* v, std::size_t ldv, int rows, int in, StridedFactor a, int rank, float scale, float* xa,
                                std::size_t ldxa);
// AVX2 for factors with contiguous rows (others go to the portable loops), the portable bits;
// only where isa_available(Isa::avx2).
void lora_project_rows_avx2(const bf16* v, std::size_t ldv, int rows, int in, StridedFactor a, int rank, float scale, float* xa,
                            std::size_t ldxa);
void lora_expand_rows_add_portable(const float* xa, std::size_t ldxa, int rows, int rank, StridedFactor b, int col0, int n, float* c,
                                   std::size_t ldc);
// As lora_project_rows_avx2.
void lora_expand_rows_add_avx2(const float* xa, std::size_t ldxa, int rows, int rank, StridedFactor b, int col0, int n, float* c,
                               std::size_t ldc);
// Only where isa_available(Isa::avx512_bf16). Vector code for the layouts the layer uses (one of
// the strides 1); any other layout goes to the portable loops.
void lora_project_rows_avx512(const bf16* v, std::size_t ldv, int rows, int in, StridedFactor a, int rank, float scale, float* xa,
                              std::size_t ldxa);
void lora_expand_rows_add_avx512(const float* xa, std::size_t ldxa, int rows, int rank, StridedFactor b, int col0, int n, float* c,
                                 std::size_t ldc);

}  // namespace tilemoe::kernels
