// LoRA gradient outer products with AVX-512, register-blocked: a tile of up to 16 q's × 16 or 32
// o's lives in zmm accumulators (one per q and 16 o's) for the whole pass over the rows, so each
// row costs one bf16->f32 conversion of v per 16 o's and one broadcast of u per q; g is touched
// once per tile. The [n][rank] layout transposes the finished tile in registers (64 shuffles per
// 16×16, once per tile) so that g is still read and written a row at a time.
#include "amx/immintrin_gcc12.hpp"

#include <utility>

#include "amx/bf16_avx512.hpp"
#include "amx/lora_grad.hpp"
#include "amx/transpose_avx512.hpp"

namespace tilemoe::kernels {
namespace {

constexpr int kMaxQ = 16;  // accumulators per 16 o's; with 2 × 16 o's at most 8 q's (16 zmm)

inline __mmask16 tail_mask(int count) {
  return count >= 16 ? static_cast<__mmask16>(0xffff) : count <= 0 ? 0 : static_cast<__mmask16>((1u << count) - 1);
}

struct Args {
  const bf16* v;
  std::size_t ldv;
  const float* u;
  std::size_t ldu;
  int rows, n;
  GradTarget g;
  std::size_t ldg;
  bool rank_major;
  bool overwrite;
};

// g[at, at + 16) (+)= v in the lanes of mask, g f32 or bf16 (added in f32, then rounded).
inline void add_masked(const Args& a, std::size_t at, __mmask16 mask, __m512 v) {
  if (a.g.is_bf16()) {
    bf16* p = a.g.bf16s() + at;
    _mm256_mask_storeu_epi16(p, mask, to_bf16(a.overwrite ? v : _mm512_add_ps(load_f32x16(p, mask), v)));
    return;
  }
  float* p = a.g.f32() + at;
  _mm512_mask_storeu_ps(p, mask, a.overwrite ? v : _mm512_add_ps(_mm512_maskz_loadu_ps(mask, p), v));
}

// The tile q0..q0+Q-1 × o0..o0+16B-1 (o clipped to n).
template <int Q, int B>
void tile(const Args& a, int q0, int o0) {
  __mmask16 mask[B];
#pragma GCC unroll 2
  for (int b = 0; b < B; ++b) mask[b] = tail_mask(a.n - o0 - 16 * b);
  __m512 acc[Q][B];
#pragma GCC unroll 16
  for (int q = 0; q < Q; ++q)
#pragma GCC unroll 2
    for (int b = 0; b < B; ++b) acc[q][b] = _mm512_setzero_ps();

  const bf16* vi = a.v + o0;
  const float* ui = a.u + q0;
  for (int i = 0; i < a.rows; ++i, vi += a.ldv, ui += a.ldu) {
    __m512 x[B];
#pragma GCC unroll 2
    for (int b = 0; b < B; ++b) x[b] = load_f32x16(vi + 16 * b, mask[b]);
#pragma GCC unroll 16
    for (int q = 0; q < Q; ++q) {
      const __m512 uq = _mm512_set1_ps(ui[q]);
#pragma GCC unroll 2
      for (int b = 0; b < B; ++b) acc[q][b] = _mm512_fmadd_ps(uq, x[b], acc[q][b]);
    }
  }

  if (a.rank_major) {
#pragma GCC unroll 16
    for (int q = 0; q < Q; ++q)
#pragma GCC unroll 2
      for (int b = 0; b < B; ++b) {
        if (mask[b] != 0) add_masked(a, static_cast<std::size_t>(q0 + q) * a.ldg + o0 + 16 * b, mask[b], acc[q][b]);
      }
    return;
  }
  const __mmask16 qmask = tail_mask(Q);
#pragma GCC unroll 2
  for (int b = 0; b < B; ++b) {
    __m512 x[16];
#pragma GCC unroll 16
    for (int q = 0; q < 16; ++q) x[q] = q < Q ? acc[q][b] : _mm512_setzero_ps();
    transpose16(x);  // x[o] now holds the Q sums of column o0 + 16b + o
    const int count = a.n - o0 - 16 * b;
    for (int o = 0; o < 16 && o < count; ++o) {
      add_masked(a, static_cast<std::size_t>(o0 + 16 * b + o) * a.ldg + q0, qmask, x[o]);
    }
  }
}

using TileFn = void (*)(const Args&, int, int);

template <int B, int... Qs>
constexpr auto make_tiles(std::integer_sequence<int, Qs...>) {
  struct Table {
    TileFn fn[sizeof...(Qs)];
  };
  return Table{{tile<Qs + 1, B>...}};
}

// Index Q-1. Two blocks of 16 o's where Q <= 8 keeps 16 accumulators busy for the common
// ranks 8 and below, and halves how often u is broadcast.
constexpr auto kTiles1 = make_tiles<1>(std::make_integer_sequence<int, kMaxQ>{});
constexpr auto kTiles2 = make_tiles<2>(std::make_integer_sequence<int, kMaxQ / 2>{});

}  // namespace

void lora_grad_outer_avx512(const bf16* v, std::size_t ldv, const float* u, std::size_t ldu, int rows, int n,
                            int rank, GradTarget g, std::size_t ldg, bool rank_major, bool overwrite) {
  if (rows <= 0 || n <= 0) return;
  const Args a{v, ldv, u, ldu, rows, n, g, ldg, rank_major, overwrite};
  for (int q0 = 0; q0 < rank; q0 += kMaxQ) {
    const int q = rank - q0 < kMaxQ ? rank - q0 : kMaxQ;
    const bool two = q <= kMaxQ / 2;
    const TileFn fn = two ? kTiles2.fn[q - 1] : kTiles1.fn[q - 1];
    const int step = two ? 32 : 16;
    for (int o0 = 0; o0 < n; o0 += step) fn(a, q0, o0);
  }
}

}  // namespace tilemoe::kernels
