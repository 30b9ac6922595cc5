// The LoRA gradient outer products on AMX tiles: T[q][o] = sum_i u[i][q] v[i][o] as the tile
// product (uᵀ) v, with the rows i as the reduction.
//
// Why tiles: the AVX-512 kernel spends one FMA per 16 products. At 4096 tokens of
// DeepSeek-V2-Lite (r = 16, about 384 rows an expert) that is 8 GFLOP a fine-tuning step over the
// six gradients that need it, on cores that stream no weights meanwhile; a TDPBF16PS does 8192
// products. On the device the 4096-token backward went from 1.27-1.40 (mean 1.32) to 1.21-1.31
// (mean 1.25) times the forward_sft of the same round, five rounds each in two calls (lora_grads
// 7.8-9.4 -> 5.0-6.0 ms). Per call most of the time is packing v and writing g, not products.
//
// Exactness: u is f32 and the tiles multiply bf16, so u is split into three bf16 parts,
// u = hi + mid + lo, each the next 8 bits of u's 24-bit significand (truncation: the parts add up
// to u exactly, and none overflows). The three products of a k-step accumulate in the same f32
// C tile, so the sums carry what the f32 FMAs of the AVX-512 kernel carry, within f32 rounding.
// A NaN in u stays NaN in hi (mid and lo are then 0); an infinity is hi alone. An infinity in v
// would meet u's zero parts (0 × inf = NaN where the sum is infinite): a pass that finds one in
// its columns hands those and the rest to the AVX-512 kernel.
//
// Tiles (palette 1, 16 rows × 64 bytes each):
//   tmm0-3 C: 16 q's × 16 o's (f32) for four o-tiles of one pass (64 columns of v)
//   tmm4-6 A: hi, mid and lo of uᵀ for one k-step (16 q's × 32 rows of bf16)
//   tmm7   B: v's 32 rows × 16 o's of one k-step, bf16 pairs of rows interleaved (VNNI)
// A pass packs its 64 columns of v once for every k-step and every 16 q's; uᵀ's parts are packed
// once a call. Rows past `rows`, q's past rank and o's past n are zeros in the packed operands
// (v and u are not read there), so no tile configuration follows the tails.
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "amx/aligned_vector.hpp"
#include "amx/isa.hpp"
#include "amx/kernel_errors.hpp"
#include "amx/lora_grad.hpp"
#include "amx/lora_grad_block_avx512.hpp"
#include "amx/tile_config.hpp"
#include "amx/tile_intrinsics.hpp"
#include "amx/transpose_avx512.hpp"

namespace tilemoe::kernels {
namespace {

constexpr int kQ = 16;           // q's of a tile (A and C rows)
constexpr int kStepRows = 32;    // rows i of a k-step: 16 bf16 pairs
constexpr int kPassTiles = 4;    // o-tiles of 16 columns a pass (tmm0-3)
constexpr int kParts = 3;        // hi, mid, lo
constexpr std::size_t kTileElements = 16 * 32;  // bf16 in one 1 KiB tile

// Below this many rows the table's entry sends the products to the AVX-512 kernel. Its FMAs grow
// with the rows; the tiles' cost is mostly per column (packing v, and writing g, transposed for
// the [n][rank] layout) and grows slowly. On the device (rank 16, bf16 g, operands in cache, one
// thread and 16 at once), AMX / AVX-512 time: 1.0-1.9 at 16-48 rows, 0.8-1.1 at 56-64, 0.6-0.9 at
// 96-384 (n = 1408, 2048); for n = 128 (a dh item's columns) 0.9-1.2 up to 384 rows.
constexpr int kTileMinRows = 64;

// Each lane's top 16 bits (the lanes hold values exactly representable as bf16) as 16 bf16.
inline __m256i top_halves(__m512 v) { return _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(v), 16)); }

inline __m512 truncate_to_bf16(__m512 v) {
  return _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
}

// uᵀ's three parts in tile order: out[((qt * ksteps + s) * kParts + part) * kTileElements], each
// tile row one q, its 32 columns rows 32 s .. 32 s + 31 of u.
void pack_u_parts(const float* u, std::size_t ldu, int rows, int rank, int ksteps, bf16* out) {
  const int qtiles = (rank + kQ - 1) / kQ;
  const __m512 infinity = _mm512_set1_ps(__builtin_inff());
  const __m512 quiet_nan = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fc00000));
  for (int qt = 0; qt < qtiles; ++qt) {
    const int q0 = qt * kQ;
    const __mmask16 qmask = lanes16(rank - q0);
    for (int i0 = 0; i0 < ksteps * kStepRows; i0 += 16) {
      __m512 part[kParts][16];
      for (int r = 0; r < 16; ++r) {
        const int i = i0 + r;
        const __m512 x = i < rows ? _mm512_maskz_loadu_ps(qmask, u + static_cast<std::size_t>(i) * ldu + q0) : _mm512_setzero_ps();
        const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
        const __mmask16 finite = _mm512_cmp_ps_mask(_mm512_abs_ps(x), infinity, _CMP_LT_OQ);
        const __m512 hi = _mm512_mask_mov_ps(truncate_to_bf16(x), nan, quiet_nan);
        const __m512 rest = _mm512_maskz_sub_ps(finite, x, hi);  // exact: the low 16 bits of x's significand
        const __m512 mid = truncate_to_bf16(rest);
        part[0][r] = hi;
        part[1][r] = mid;
        part[2][r] = _mm512_sub_ps(rest, mid);  // exact, and at most 8 significant bits
      }
      const int s = i0 / kStepRows, col = i0 % kStepRows;
      for (int p = 0; p < kParts; ++p) {
        transpose16(part[p]);  // part[p][q] lane r: row i0 + r, q0 + q
        bf16* tile = out + ((static_cast<std::size_t>(qt) * ksteps + s) * kParts + p) * kTileElements;
        for (int q = 0; q < kQ; ++q)
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(tile + static_cast<std::size_t>(q) * 32 + col), top_halves(part[p][q]));
      }
    }
  }
}

// Columns [o0, o0 + 16 * tiles) of v (clipped to n) for every k-step, as B tiles:
// out[(s * kPassTiles + j) * kTileElements], tile row r = rows 32 s + 2r and 32 s + 2r + 1
// interleaved element by element. Returns false when one of them is an infinity or a NaN.
bool pack_v_pass(const bf16* v, std::size_t ldv, const int* v_rows, int rows, int n, int o0, int tiles, int ksteps, bf16* out) {
  auto row = [&](int i) { return v + static_cast<std::size_t>(v_rows ? v_rows[i] : i) * ldv; };
  const __m512i exponent = _mm512_set1_epi16(0x7f80);
  __mmask32 special = 0;
  for (int j = 0; j < tiles; ++j) {
    const int oj = o0 + 16 * j;
    const __mmask16 mask = lanes16(n - oj);
    for (int s = 0; s < ksteps; ++s) {
      bf16* tile = out + (static_cast<std::size_t>(s) * kPassTiles + j) * kTileElements;
      for (int r = 0; r < 16; ++r) {
        const int i = s * kStepRows + 2 * r;
        const __m256i even = i < rows ? _mm256_maskz_loadu_epi16(mask, row(i) + oj) : _mm256_setzero_si256();
        const __m256i odd = i + 1 < rows ? _mm256_maskz_loadu_epi16(mask, row(i + 1) + oj) : _mm256_setzero_si256();
        const __m512i pairs = _mm512_or_si512(_mm512_cvtepu16_epi32(even), _mm512_slli_epi32(_mm512_cvtepu16_epi32(odd), 16));
        _mm512_store_si512(tile + static_cast<std::size_t>(r) * 32, pairs);
        special |= _mm512_cmpeq_epi16_mask(_mm512_and_si512(pairs, exponent), exponent);
      }
    }
  }
  return special == 0;
}

// One k-step's three products into C tile j. GCC 12's tile intrinsics paste their operands into
// the assembly text: every tile number is a literal.
inline void step_products(int j, const bf16* b) {
  _tile_loadd(7, b, 64);
  switch (j) {
    case 0: _tile_dpbf16ps(0, 4, 7); _tile_dpbf16ps(0, 5, 7); _tile_dpbf16ps(0, 6, 7); break;
    case 1: _tile_dpbf16ps(1, 4, 7); _tile_dpbf16ps(1, 5, 7); _tile_dpbf16ps(1, 6, 7); break;
    case 2: _tile_dpbf16ps(2, 4, 7); _tile_dpbf16ps(2, 5, 7); _tile_dpbf16ps(2, 6, 7); break;
    default: _tile_dpbf16ps(3, 4, 7); _tile_dpbf16ps(3, 5, 7); _tile_dpbf16ps(3, 6, 7); break;
  }
}

inline void zero_c(int tiles) {
  _tile_zero(0);
  if (tiles > 1) _tile_zero(1);
  if (tiles > 2) _tile_zero(2);
  if (tiles > 3) _tile_zero(3);
}

inline void store_c(int j, float* dst) {
  switch (j) {
    case 0: _tile_stored(0, dst, 64); break;
    case 1: _tile_stored(1, dst, 64); break;
    case 2: _tile_stored(2, dst, 64); break;
    default: _tile_stored(3, dst, 64); break;
  }
}

}  // namespace

void lora_grad_outer_amx(const bf16* v, std::size_t ldv, const int* v_rows, const float* u, std::size_t ldu, int rows, int n, int rank, GradTarget g,
                         std::size_t ldg, bool rank_major, bool overwrite) {
  if (rows < kTileMinRows) return lora_grad_outer_avx512(v, ldv, v_rows, u, ldu, rows, n, rank, g, ldg, rank_major, overwrite);
  lora_grad_outer_amx_tiles(v, ldv, v_rows, u, ldu, rows, n, rank, g, ldg, rank_major, overwrite);
}

void lora_grad_outer_amx_tiles(const bf16* v, std::size_t ldv, const int* v_rows, const float* u, std::size_t ldu, int rows, int n, int rank, GradTarget g,
                               std::size_t ldg, bool rank_major, bool overwrite) {
  if (rows <= 0 || n <= 0 || rank <= 0) return;
  if (!tile_instructions_usable()) fail_tiles_unusable("lora_grad_outer_amx_tiles");
  const int ksteps = (rows + kStepRows - 1) / kStepRows;
  const int qtiles = (rank + kQ - 1) / kQ;
  thread_local AlignedVector<bf16> a_parts, b_pass;
  grow_to(a_parts, static_cast<std::size_t>(qtiles) * ksteps * kParts * kTileElements);
  grow_to(b_pass, static_cast<std::size_t>(ksteps) * kPassTiles * kTileElements);
  pack_u_parts(u, ldu, rows, rank, ksteps, a_parts.data());

  ensure_tile_config(make_tile_config(16, 16));
  __asm__ volatile("" ::: "memory");
  alignas(64) float c[kQ * 16];
  for (int o0 = 0; o0 < n; o0 += kPassTiles * 16) {
    const int tiles = std::min(kPassTiles, (n - o0 + 15) / 16);
    if (!pack_v_pass(v, ldv, v_rows, rows, n, o0, tiles, ksteps, b_pass.data())) {
      // 0 × inf is NaN on the tiles, where u's zero parts meet an infinite v: these columns and
      // the rest go to the f32 FMAs, which give the infinity the sum has.
      const GradTarget rest = g.offset(rank_major ? static_cast<std::size_t>(o0) : static_cast<std::size_t>(o0) * ldg);
      return lora_grad_outer_avx512(v + o0, ldv, v_rows, u, ldu, rows, n - o0, rank, rest, ldg, rank_major, overwrite);
    }
    __asm__ volatile("" ::: "memory");
    for (int qt = 0; qt < qtiles; ++qt) {
      zero_c(tiles);
      for (int s = 0; s < ksteps; ++s) {
        const bf16* a = a_parts.data() + (static_cast<std::size_t>(qt) * ksteps + s) * kParts * kTileElements;
        _tile_loadd(4, a, 64);
        _tile_loadd(5, a + kTileElements, 64);
        _tile_loadd(6, a + 2 * kTileElements, 64);
        const bf16* b = b_pass.data() + static_cast<std::size_t>(s) * kPassTiles * kTileElements;
        for (int j = 0; j < tiles; ++j) step_products(j, b + j * kTileElements);
      }
      const int q0 = qt * kQ, qn = std::min(kQ, rank - q0);
      for (int j = 0; j < tiles; ++j) {
        store_c(j, c);
        __asm__ volatile("" ::: "memory");
        __m512 x[16];
        for (int q = 0; q < 16; ++q) x[q] = _mm512_load_ps(c + q * 16);
        write_grad_block(g, ldg, rank_major, overwrite, x, q0, qn, o0 + 16 * j, n - o0 - 16 * j);
      }
    }
  }
}

}  // namespace tilemoe::kernels
