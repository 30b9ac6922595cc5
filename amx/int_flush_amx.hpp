#pragma once
// The integer tile kernel's flush (gemm_int_amx.cpp): a C tile's exact int32 sums, scaled in f32
// by the activation row's scale and the weight column's, go into C (or as bf16 into y), with the
// bf16 second product's tile (a LoRA term) added on the way. For *_amx.cpp files only (AVX-512);
// needs <immintrin.h> (amx/immintrin_gcc12.hpp) first.
#include <cstddef>
#include <cstdint>

#include "amx/bf16_avx512.hpp"
#include "amx/pack_int.hpp"

namespace tilemoe::kernels {

// dst (row stride ld) = (or +=, with add) sa[i] * scale * sums[i] for a tile's rows. The loop
// reads only locals besides sums and dst: through the job the compiler had to reload every field
// after each store (a store to C may alias it), ~20 instructions a row instead of 5.
// `extra` (16 floats a row, or null) is added too: the bf16 second product's tile.
__attribute__((always_inline)) inline void scale_sums_into(const std::int32_t* sums, int rows, __m512 scale, const float* sa, float* dst,
                                                           std::size_t ld, bool add, const float* extra) {
  for (int i = 0; i < rows; ++i) {
    const __m512 f = _mm512_mul_ps(scale, _mm512_set1_ps(sa[i]));
    __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_load_si512(sums + i * 16)), f);
    if (extra) v = _mm512_add_ps(v, _mm512_load_ps(extra + i * 16));
    if (add) v = _mm512_add_ps(v, _mm512_loadu_ps(dst + i * ld));
    _mm512_storeu_ps(dst + i * ld, v);
  }
}

// The same written as bf16 into y's rows (ldy apart), as GemmIntArgs::y asks: one conversion on the
// way out instead of an f32 C that a pass of its own reads again.
__attribute__((always_inline)) inline void scale_sums_into_bf16(const std::int32_t* sums, int rows, __m512 scale, const float* sa,
                                                                bf16* y, std::size_t ldy, const float* extra) {
  for (int i = 0; i < rows; ++i) {
    const __m512 f = _mm512_mul_ps(scale, _mm512_set1_ps(sa[i]));
    __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_load_si512(sums + i * 16)), f);
    if (extra) v = _mm512_add_ps(v, _mm512_load_ps(extra + i * 16));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + i * ldy), to_bf16(v));
  }
}

// One C tile's scaled write: dst rows (ld apart) = (or +=) sa[i] * scale * sums[i] (+ extra[i]),
// or, with y, the same as bf16 into y's rows.
struct TileFlush {
  const std::int32_t* sums;
  const float* scale;  // the panel's 16 column scales
  const float* sa;
  float* dst;
  const float* extra;
  int rows;
  bf16* y = nullptr;
};

// One scale group: a block's flush (AVX-512) runs during the next block's first k-steps, one C
// tile a step, so that it overlaps that block's tile products instead of following its own
// stores. The sums and the LoRA's tiles wait in one of two slots meanwhile. The blocks write
// disjoint parts of C, so the order of the writes does not change a bit. On the device (call 4 of
// session 24, the two forms taking turns call by call in one process, two rounds), 4096 tokens of
// DeepSeek-V2-Lite: int8 r=0 60.0 / 55.1 -> 56.5 / 53.0 ms, r=16 68.5 / 62.5 -> 62.7 / 58.8, int4
// g128 r=0 56.3 / 58.8 -> 55.5 / 56.8; 512 and 1024 tokens did not change beyond the noise.
struct DeferredFlush {
  alignas(64) std::int32_t sums[2][4][kIntATileRows * 16];
  alignas(64) float extra[2][4][kIntATileRows * 16];
  TileFlush pending[4];
  int count = 0, next = 0;
  int slot = 0;  // the slot the next block stores into
  std::size_t ld = 0, ldy = 0;
  bool add = false;

  void run_one() {
    const TileFlush& f = pending[next++];
    if (f.y) return scale_sums_into_bf16(f.sums, f.rows, _mm512_loadu_ps(f.scale), f.sa, f.y, ldy, f.extra);
    scale_sums_into(f.sums, f.rows, _mm512_loadu_ps(f.scale), f.sa, f.dst, ld, add, f.extra);
  }
  void run_all() {
    while (next < count) run_one();
    count = next = 0;
  }
};

}  // namespace tilemoe::kernels
