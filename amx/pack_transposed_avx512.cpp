// The transposed repack with AVX-512: it runs over every weight byte of the backward, so it has to
// keep up with memory bandwidth.
//
// Take the two forward blocks (panels 2j and 2j+1, k-block kb): 32 W rows h × 32 k-columns. Write
// both as address bits (most significant first; a zmm row is the low 5 bits, 32 words):
//   forward:     h4 | k4 k3 k2 k1 | h3 h2 h1 h0 k0     (panel, k-pair row, column, half)
//   transposed:  k4 | h4 h3 h2 h1 | k3 k2 k1 k0 h0     (panel q, k-pair row, column, half)
// h4 and k4 only pick which registers meet, so the whole job is four independent 8×8 transposes of
// qwords (k3k2k1 trades places with h3h2h1) plus swapping the middle two words of every qword
// ((h0, k0) -> (k0, h0)). Rows q*8..q*8+7 of forward block 2j+b become rows b*8..b*8+7 of transposed
// block (q, j): 8 in-lane byte shuffles + 24 qword/lane shuffles per 512 bytes, 128 shuffles per
// pair of input blocks.
#include "amx/immintrin_gcc12.hpp"

#include "amx/pack_transposed.hpp"
#include "amx/prefetch.hpp"

namespace tilemoe::kernels {
namespace {

static_assert(kBlockElements * sizeof(bf16) == kTileBlockBytes, "prefetch_tile_block_* ask for one packed block");

// Panels to prefetch ahead, 0 for none. Consecutive panels of one k-block are kblocks KiB apart,
// a new page each time, where the hardware prefetchers start over. One thread, 500 MiB of
// weights from memory, GB/s of input (noisy VMs, three runs each): on a Xeon with AMX, none
// 6.5-10.7, 2 panels 7.5-11.0 (about +10%), 4 or 8 no better than 2; on Zen 4, none 18-21,
// 2 panels 16-19 (about -5%), and in L2 it costs 5% on both. The Xeon decides.
constexpr int kPrefetchPanels = 2;

// In every qword, words (0, 1, 2, 3) -> (0, 2, 1, 3): (h0, k0) order becomes (k0, h0).
inline __m512i swap_middle_words(__m512i x) {
  const __m512i index = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 1, 4, 5, 2, 3, 6, 7, 8, 9, 12, 13, 10, 11, 14, 15));
  return _mm512_shuffle_epi8(x, index);
}

// Eight k-pair rows of one forward block -> eight rows of one transposed block. Output row n,
// qword m = input row m, qword n (then the word swap).
inline void transpose_half(const bf16* in, bf16* out) {
  __m512i r[8], t[8];
#pragma GCC unroll 8
  for (int m = 0; m < 8; ++m) r[m] = swap_middle_words(_mm512_loadu_si512(in + m * 32));
  // t[2i+e], lane l = (r[2i] qword 2l+e, r[2i+1] qword 2l+e).
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm512_unpacklo_epi64(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi64(r[2 * i], r[2 * i + 1]);
  }
  // Output row 2l+e, lane i = t[2i+e], lane l: a 4×4 transpose of 128-bit lanes for each e.
#pragma GCC unroll 2
  for (int e = 0; e < 2; ++e) {
    const __m512i u0 = _mm512_shuffle_i64x2(t[e], t[2 + e], 0x44);  // (a0.l0, a0.l1, a1.l0, a1.l1)
    const __m512i u1 = _mm512_shuffle_i64x2(t[e], t[2 + e], 0xee);  // (a0.l2, a0.l3, a1.l2, a1.l3)
    const __m512i u2 = _mm512_shuffle_i64x2(t[4 + e], t[6 + e], 0x44);
    const __m512i u3 = _mm512_shuffle_i64x2(t[4 + e], t[6 + e], 0xee);
    _mm512_storeu_si512(out + (0 + e) * 32, _mm512_shuffle_i64x2(u0, u2, 0x88));  // lane 0 of a0..a3
    _mm512_storeu_si512(out + (2 + e) * 32, _mm512_shuffle_i64x2(u0, u2, 0xdd));  // lane 1
    _mm512_storeu_si512(out + (4 + e) * 32, _mm512_shuffle_i64x2(u1, u3, 0x88));  // lane 2
    _mm512_storeu_si512(out + (6 + e) * 32, _mm512_shuffle_i64x2(u1, u3, 0xdd));  // lane 3
  }
}

}  // namespace

void pack_transposed_kblock_avx512(const bf16* packed_w, int panels, int kblocks, int kb, bf16* dst,
                                   std::size_t dst_panel_stride) {
  const std::size_t panel_step = static_cast<std::size_t>(kblocks) * kBlockElements;
  const bf16* src = packed_w + static_cast<std::size_t>(kb) * kBlockElements;
  for (int p = 0; p < kPrefetchPanels && p < panels; ++p) prefetch_tile_block_l1(src + p * panel_step);
  walk_transposed_kblock(panels, dst, dst_panel_stride, [&](int nb, bf16* o0, bf16* o1) {
    if (nb + kPrefetchPanels < panels) prefetch_tile_block_l1(src + (nb + kPrefetchPanels) * panel_step);
    const bf16* block = src + nb * panel_step;
    transpose_half(block, o0);                       // k-pairs 0..7: W's k-columns 0..15
    transpose_half(block + kBlockElements / 2, o1);  // k-pairs 8..15: 16..31
  });
}

}  // namespace tilemoe::kernels
