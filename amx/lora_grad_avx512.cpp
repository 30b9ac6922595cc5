// LoRA gradient outer products with AVX-512, register-blocked: a tile of up to 16 q's × 16 or 32
// o's lives in zmm accumulators (one per q and 16 o's) for the whole pass over the rows, so each
// row costs one bf16->f32 conversion of v per 16 o's and one broadcast of u per q; g is touched
// once per tile (lora_grad_block_avx512.hpp).
#include "amx/immintrin_gcc12.hpp"

#include <utility>

#include "amx/lora_grad.hpp"
#include "amx/lora_grad_block_avx512.hpp"

namespace tilemoe::kernels {
namespace {

constexpr int kMaxQ = 16;  // accumulators per 16 o's; with 2 × 16 o's at most 8 q's (16 zmm)
constexpr int kLineElements = 32;  // bf16 values of v in a cache line
constexpr int kAheadLines = 2;

struct Args {
  const bf16* v;
  std::size_t ldv;
  const int* v_rows;  // or null: row i at v + i * ldv
  const float* u;
  std::size_t ldu;
  int rows, n;
  GradTarget g;
  std::size_t ldg;
  bool rank_major;
  bool overwrite;
};

// The tile q0..q0+Q-1 × o0..o0+16B-1 (o clipped to n).
template <int Q, int B>
void tile(const Args& a, int q0, int o0) {
  __mmask16 mask[B];
#pragma GCC unroll 2
  for (int b = 0; b < B; ++b) mask[b] = lanes16(a.n - o0 - 16 * b);
  __m512 acc[Q][B];
#pragma GCC unroll 16
  for (int q = 0; q < Q; ++q)
#pragma GCC unroll 2
    for (int b = 0; b < B; ++b) acc[q][b] = _mm512_setzero_ps();

  // Rows of v are KiBs apart (the saved x's, by token): the hardware does not follow them, so the
  // sweep asks for each row's line kAheadLines on whenever it starts a new line of the row.
  const bool ask = o0 % kLineElements == 0 && o0 + kAheadLines * kLineElements < a.n;
  const float* ui = a.u + q0;
  for (int i = 0; i < a.rows; ++i, ui += a.ldu) {
    const bf16* vi = a.v + static_cast<std::size_t>(a.v_rows ? a.v_rows[i] : i) * a.ldv + o0;
    if (ask) _mm_prefetch(reinterpret_cast<const char*>(vi + kAheadLines * kLineElements), _MM_HINT_T0);
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

#pragma GCC unroll 2
  for (int b = 0; b < B; ++b) {
    __m512 x[16];
#pragma GCC unroll 16
    for (int q = 0; q < 16; ++q) x[q] = q < Q ? acc[q][b] : _mm512_setzero_ps();
    write_grad_block(a.g, a.ldg, a.rank_major, a.overwrite, x, q0, Q, o0 + 16 * b, a.n - o0 - 16 * b);
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

void lora_grad_outer_avx512(const bf16* v, std::size_t ldv, const int* v_rows, const float* u, std::size_t ldu, int rows, int n,
                            int rank, GradTarget g, std::size_t ldg, bool rank_major, bool overwrite) {
  if (rows <= 0 || n <= 0) return;
  const Args a{v, ldv, v_rows, u, ldu, rows, n, g, ldg, rank_major, overwrite};
  for (int q0 = 0; q0 < rank; q0 += kMaxQ) {
    const int q = rank - q0 < kMaxQ ? rank - q0 : kMaxQ;
    const bool two = q <= kMaxQ / 2;
    const TileFn fn = two ? kTiles2.fn[q - 1] : kTiles1.fn[q - 1];
    const int step = two ? 32 : 16;
    for (int o0 = 0; o0 < n; o0 += step) fn(a, q0, o0);
  }
}

}  // namespace tilemoe::kernels
