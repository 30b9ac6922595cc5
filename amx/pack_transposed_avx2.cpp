// The transposed repack with AVX2: the backward runs it over every weight byte, and element by
// element (the portable loop) it took half of a fine-tuning step's time on a Zen 3.
//
// The same address-bit view as pack_transposed_avx512.cpp: after swapping the middle two words of
// every qword ((h0, k0) -> (k0, h0)), eight k-pair rows of a forward block are an 8×8 matrix of
// qwords whose transpose is eight rows of the transposed block. A ymm holds four qwords, so the 8×8
// transpose is four independent 4×4 ones: qwords 0-3 / 4-7 of input rows 0-3 / 4-7 become qwords
// 0-3 / 4-7 of output rows 0-3 / 4-7, input half and row group trading places.
#include <immintrin.h>

#include "amx/pack_transposed.hpp"
#include "amx/prefetch.hpp"

namespace tilemoe::kernels {
namespace {

// In every qword, words (0, 1, 2, 3) -> (0, 2, 1, 3).
inline __m256i swap_middle_words(__m256i x) {
  const __m256i index = _mm256_broadcastsi128_si256(_mm_setr_epi8(0, 1, 4, 5, 2, 3, 6, 7, 8, 9, 12, 13, 10, 11, 14, 15));
  return _mm256_shuffle_epi8(x, index);
}

// Qwords [in_half*4, in_half*4 + 4) of input rows [in_row0, in_row0 + 4) -> qwords
// [in_row0, in_row0 + 4) of output rows [in_half*4, in_half*4 + 4). Rows are 32 words apart.
inline void transpose_quarter(const bf16* in, bf16* out, int in_row0, int in_half) {
  __m256i r[4];
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i)
    r[i] = swap_middle_words(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + (in_row0 + i) * 32 + in_half * 16)));
  // t0 = (r0.q0, r1.q0, r0.q2, r1.q2), t1 = (r0.q1, r1.q1, r0.q3, r1.q3); t2, t3 the same of r2, r3.
  const __m256i t0 = _mm256_unpacklo_epi64(r[0], r[1]), t1 = _mm256_unpackhi_epi64(r[0], r[1]);
  const __m256i t2 = _mm256_unpacklo_epi64(r[2], r[3]), t3 = _mm256_unpackhi_epi64(r[2], r[3]);
  const __m256i o[4] = {_mm256_permute2x128_si256(t0, t2, 0x20), _mm256_permute2x128_si256(t1, t3, 0x20),
                        _mm256_permute2x128_si256(t0, t2, 0x31), _mm256_permute2x128_si256(t1, t3, 0x31)};
#pragma GCC unroll 4
  for (int n = 0; n < 4; ++n)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + (in_half * 4 + n) * 32 + (in_row0 / 4) * 16), o[n]);
}

// Eight k-pair rows of one forward block -> eight rows of one transposed block: output row n,
// qword m = input row m, qword n (then the word swap).
inline void transpose_half(const bf16* in, bf16* out) {
  transpose_quarter(in, out, 0, 0);
  transpose_quarter(in, out, 4, 0);
  transpose_quarter(in, out, 0, 1);
  transpose_quarter(in, out, 4, 1);
}

}  // namespace

void pack_transposed_kblock_avx2(const bf16* packed_w, int panels, int kblocks, int kb, bf16* dst,
                                 std::size_t dst_panel_stride) {
  const std::size_t panel_step = static_cast<std::size_t>(kblocks) * kBlockElements;
  const bf16* src = packed_w + static_cast<std::size_t>(kb) * kBlockElements;
  // A call reads one block of every panel, the panels kblocks KiB apart (a new page each time, where
  // the hardware prefetchers start over), and the next call the block after each: asked for into
  // L2 here, they no longer wait on memory one by one.
  const bool prefetch_next = kb + 1 < kblocks;
  walk_transposed_kblock(panels, dst, dst_panel_stride, [&](int nb, bf16* o0, bf16* o1) {
    const bf16* block = src + nb * panel_step;
    if (prefetch_next) prefetch_tile_block_l2(block + kBlockElements);
    transpose_half(block, o0);                       // k-pairs 0..7: W's k-columns 0..15
    transpose_half(block + kBlockElements / 2, o1);  // k-pairs 8..15: 16..31
  });
}

}  // namespace tilemoe::kernels
