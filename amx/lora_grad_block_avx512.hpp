#pragma once
// How the LoRA gradient kernels (AVX-512 and AMX) put a finished 16 q × 16 o block of sums into
// the gradient, for AVX-512 and AMX translation units only.
// Both layouts of lora_grad.hpp: [rank][n] a row of 16 o's per q; [n][rank] the block
// transposed in registers first, so that g is still written a row of q's at a time.
#include "amx/immintrin_gcc12.hpp"

#include <cstddef>

#include "amx/bf16_avx512.hpp"
#include "amx/lora_grad.hpp"
#include "amx/transpose_avx512.hpp"

namespace tilemoe::kernels {

// g[at, at + 16) (+)= v in the lanes of mask, g f32 or bf16 (added in f32, then rounded once).
inline void add_to_grad(GradTarget g, std::size_t at, __mmask16 mask, __m512 v, bool overwrite) {
  if (g.is_bf16()) {
    bf16* p = g.bf16s() + at;
    _mm256_mask_storeu_epi16(p, mask, to_bf16(overwrite ? v : _mm512_add_ps(load_f32x16(p, mask), v)));
    return;
  }
  float* p = g.f32() + at;
  _mm512_mask_storeu_ps(p, mask, overwrite ? v : _mm512_add_ps(_mm512_maskz_loadu_ps(mask, p), v));
}

// x[q] lane c holds the sum for q0 + q and o0 + c; rows q >= qn and lanes c >= count are not
// written (whatever they hold, NaN included). x is clobbered.
inline void write_grad_block(GradTarget g, std::size_t ldg, bool rank_major, bool overwrite, __m512 (&x)[16], int q0, int qn, int o0,
                             int count) {
  if (count <= 0) return;
  if (rank_major) {
    const __mmask16 mask = lanes16(count);
    for (int q = 0; q < qn; ++q) add_to_grad(g, static_cast<std::size_t>(q0 + q) * ldg + o0, mask, x[q], overwrite);
    return;
  }
  transpose16(x);  // x[c] now holds the sums of column o0 + c, one lane per q
  const __mmask16 qmask = lanes16(qn);
  for (int c = 0; c < 16 && c < count; ++c) add_to_grad(g, static_cast<std::size_t>(o0 + c) * ldg + q0, qmask, x[c], overwrite);
}

}  // namespace tilemoe::kernels
