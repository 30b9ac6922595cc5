// The per-call LoRA packing with AVX-512, straight from the caller's f32 or bf16 to packed blocks.
//
// Rows along k (w(col, kk) contiguous in kk, the forward's factors): a column's 32 k of one
// k-block convert to 16 k-pairs, one zmm of 32-bit words; the block's 16 columns are 16 zmm and
// a 16 x 16 transpose of those words gives the block's rows (k-pair r of every column), so a
// 1 KiB block costs 32 loads, 16 stores and 64 shuffles. Rows along n (contiguous in col, the
// backward's transposed factors): a block row is two k rows of 16 columns, converted and
// interleaved with one permute. The portable packer went through a scratch copy and moved the
// k-pairs as 32-bit words one at a time, about 130 us per expert factor pair at V2-Lite's size.
#include "amx/immintrin_gcc12.hpp"

#include <algorithm>

#include "amx/bf16_avx512.hpp"
#include "amx/convert_bf16.hpp"
#include "amx/pack_strided.hpp"
#include "amx/transpose_avx512.hpp"

namespace tilemoe::kernels {
namespace {

template <typename T>
void pack_rows_along_k(StridedFactor w, int n, int k, const PackedShape& s, bf16* packed) {
  bf16* out = packed;
  for (int nb = 0; nb < s.panels; ++nb) {
    for (int kb = 0; kb < s.kblocks; ++kb, out += kBlockElements) {
      const int k0 = kb * kBlockK;
      const __mmask16 lo = lanes16(k - k0), hi = lanes16(k - k0 - 16);
      __m512 x[kPanelColumns];
      for (int c = 0; c < kPanelColumns; ++c) {
        const int col = nb * kPanelColumns + c;
        if (col >= n) {
          x[c] = _mm512_setzero_ps();
          continue;
        }
        const T* src = w.as<T>() + static_cast<std::size_t>(col) * w.row_stride + k0;
        const __m256i a = load_bf16x16(src, lo);
        const __m256i b = load_bf16x16(src + 16, hi);
        x[c] = _mm512_castsi512_ps(_mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1));
      }
      transpose16(x);  // x[r] lane c = k-pair r of column c
      for (int r = 0; r < kBlockK / 2; ++r) _mm512_storeu_ps(out + r * 2 * kPanelColumns, x[r]);
    }
  }
}

template <typename T>
void pack_rows_along_n(StridedFactor w, int n, int k, const PackedShape& s, bf16* packed) {
  // Lane 2c of a block row is column c of the even k row, lane 2c+1 of the odd one.
  alignas(64) static constexpr short kInterleave[32] = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23,
                                                        8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i interleave = _mm512_load_si512(kInterleave);
  bf16* out = packed;
  for (int nb = 0; nb < s.panels; ++nb) {
    const __mmask16 cols = lanes16(n - nb * kPanelColumns);
    const T* base = w.as<T>() + static_cast<std::size_t>(nb) * kPanelColumns;
    for (int kk = 0; kk < s.k_padded; kk += 2, out += 2 * kPanelColumns) {
      const __mmask16 even = kk < k ? cols : 0, odd = kk + 1 < k ? cols : 0;
      const __m256i a = load_bf16x16(base + static_cast<std::size_t>(kk) * w.col_stride, even);
      const __m256i b = load_bf16x16(base + static_cast<std::size_t>(kk + 1) * w.col_stride, odd);
      const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
      _mm512_storeu_si512(out, _mm512_permutexvar_epi16(interleave, both));
    }
  }
}

}  // namespace

void pack_strided_avx512(StridedFactor w, int n, int k, bf16* packed, std::vector<bf16>& scratch) {
  const PackedShape s = packed_shape(n, k);
  if (s.panels == 0 || s.kblocks == 0) return;
  const bool bf16s = w.is_bf16();
  if (w.col_stride == 1) return bf16s ? pack_rows_along_k<bf16>(w, n, k, s, packed) : pack_rows_along_k<float>(w, n, k, s, packed);
  if (w.row_stride == 1) return bf16s ? pack_rows_along_n<bf16>(w, n, k, s, packed) : pack_rows_along_n<float>(w, n, k, s, packed);
  pack_strided_with(w, n, k, packed, convert_to_bf16_avx512, scratch);
}

}  // namespace tilemoe::kernels
