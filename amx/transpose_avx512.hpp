#pragma once
// A 16 x 16 transpose of 32-bit lanes in zmm registers, for the AVX-512 kernels only (include
// from *_avx512.cpp files after amx/immintrin_gcc12.hpp).

namespace tilemoe::kernels {

// x[c] becomes column c of the 16×16 matrix whose row r was x[r].
inline void transpose16(__m512 (&x)[16]) {
  __m512 t[16];
  // t[2i] lane l = (r[2i][4l], r[2i+1][4l], r[2i][4l+1], r[2i+1][4l+1]); t[2i+1] the same for 4l+2, 4l+3.
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(x[2 * i], x[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(x[2 * i], x[2 * i + 1]);
  }
  // s[4i+e] lane l = rows 4i..4i+3 of column 4l+e.
  __m512 s[16];
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]);
    const __m512d c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
    s[4 * i + 0] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    s[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    s[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    s[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
  // Column 4l+e, lane i = s[4i+e] lane l: a 4×4 transpose of 128-bit lanes for each e.
#pragma GCC unroll 4
  for (int e = 0; e < 4; ++e) {
    const __m512 u0 = _mm512_shuffle_f32x4(s[e], s[4 + e], 0x44);
    const __m512 u1 = _mm512_shuffle_f32x4(s[e], s[4 + e], 0xee);
    const __m512 u2 = _mm512_shuffle_f32x4(s[8 + e], s[12 + e], 0x44);
    const __m512 u3 = _mm512_shuffle_f32x4(s[8 + e], s[12 + e], 0xee);
    x[0 + e] = _mm512_shuffle_f32x4(u0, u2, 0x88);
    x[4 + e] = _mm512_shuffle_f32x4(u0, u2, 0xdd);
    x[8 + e] = _mm512_shuffle_f32x4(u1, u3, 0x88);
    x[12 + e] = _mm512_shuffle_f32x4(u1, u3, 0xdd);
  }
}

}  // namespace tilemoe::kernels
