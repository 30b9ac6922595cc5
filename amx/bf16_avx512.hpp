#pragma once
// bf16 <-> f32 in zmm registers, for the AVX-512 kernels only (include from *_avx512.cpp files,
// which are compiled for AVX-512). Needs <immintrin.h> (amx/immintrin_gcc12.hpp) included first.
#include <cstddef>

#include "tilemoe/bf16.hpp"

namespace tilemoe::kernels {

// Bit-identical to tilemoe::float_to_bf16 (VCVTNEPS2BF16 would flush denormals to zero).
inline __m256i to_bf16(__m512 v) {
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(0x7fff)), lsb), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(0x40));
  rounded = _mm512_mask_mov_epi32(rounded, nan, quiet);
  return _mm512_cvtepi32_epi16(rounded);
}

// The first `count` of 16 lanes (all for count >= 16, none for count <= 0): the mask of a row's
// last, partial vector.
inline __mmask16 lanes16(int count) {
  return count >= 16 ? static_cast<__mmask16>(0xffff) : count <= 0 ? 0 : static_cast<__mmask16>((1u << count) - 1);
}
// The same for an unsigned count (what is left of a row of any length).
inline __mmask16 lanes16(std::size_t count) { return lanes16(count >= 16 ? 16 : static_cast<int>(count)); }

inline __m512 bf16_to_f32(__m256i v) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16)); }

// 16 consecutive elements of f32 or bf16 storage (the caller's LoRA factors may be either), as
// f32 or as bf16: masked-off lanes are zero and their memory is not touched.
inline __m512 load_f32x16(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
inline __m512 load_f32x16(const bf16* p, __mmask16 m) { return bf16_to_f32(_mm256_maskz_loadu_epi16(m, p)); }
inline __m256i load_bf16x16(const float* p, __mmask16 m) { return to_bf16(_mm512_maskz_loadu_ps(m, p)); }
inline __m256i load_bf16x16(const bf16* p, __mmask16 m) { return _mm256_maskz_loadu_epi16(m, p); }

}  // namespace tilemoe::kernels
