// MXFP4 weights on AMX tiles where the dequantization, not the tiles, sets the pace: experts of a
// few rows (gpt-oss-120b at 64-256 tokens), where each weight dequantized serves one or two row
// tiles' products. gemm_mxfp4's other routes dequantize blocks, then run the bf16 tile kernel over
// them: the vector units (the lookups) and the tile unit took turns. Here each k-step's products
// are issued between the dequantizations of the next k-step's blocks (Mxfp4LineLookup::block),
// so that the tile unit multiplies while the vector units look up. On the device (Emerald Rapids,
// 16 vCPUs, held LoRA r=16) that took DeepSeek-V2-Lite's shape at 64-256 tokens 35-45 % faster
// and gpt-oss-120b at 128 and 256 tokens 18-37 % (docs/perf.md, session 58).
//
// gemm_mxfp4_few_rows_amx, one row tile (up to 16 rows): tile_config.hpp's configuration for `m`
// rows in both row tiles; tmm0-3 C, one panel each (a group of up to 4 panels); tmm4 and tmm5 A,
// taking turns by k-step so that a k-step's A load does not wait for the last product of the
// previous one; tmm6 and tmm7 B, taking turns by panel, from an 8 KiB buffer in L1 (this k-step's
// blocks and the next's).
//
// gemm_mxfp4_pair_first_block_amx, the first 32 rows of a pair of panels: the 2x2 block of the
// bf16 kernel (tile_block.hpp's registers), each k-step's blocks dequantized into the pair's
// whole-K buffer during the previous k-step's products; the other rows then read that buffer
// from L2 through the bf16 kernel.
//
// Both compute the products of gemm_bf16_amx on the dequantized weights, k-steps in order.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "amx/gemm_mxfp4.hpp"
#include "amx/isa.hpp"
#include "amx/kernel_errors.hpp"
#include "amx/mxfp4_lookup_avx512.hpp"
#include "amx/tile_block.hpp"
#include "amx/tile_config.hpp"
#include "amx/tile_intrinsics.hpp"

namespace tilemoe::kernels {
namespace {

constexpr int kGroupPanels = 4;
// Each panel's codes are asked for this many blocks ahead of the block being dequantized.
constexpr int kCodePrefetchBlocks = 2;

// The dequantized blocks of one k-step of a group, and of the next.
struct alignas(64) StepBlocks {
  bf16 block[2][kGroupPanels][kBlockElements];
};

// GCC 12's tile intrinsics paste their operands into the assembly text: tile numbers must be
// literals, so each register choice is spelled out.
template <int A>
inline void load_a(const bf16* a, long row_bytes) {
  if constexpr (A == 4) _tile_loadd(4, a, row_bytes);
  else _tile_loadd(5, a, row_bytes);
}

// Panel p of the group: C tile p, B register 6 + p % 2, from A register A.
template <int P, int A>
inline void product(const bf16* b) {
  if constexpr (P % 2 == 0) _tile_loadd(6, b, 64);
  else _tile_loadd(7, b, 64);
  if constexpr (A == 4) {
    if constexpr (P == 0) _tile_dpbf16ps(0, 4, 6);
    if constexpr (P == 1) _tile_dpbf16ps(1, 4, 7);
    if constexpr (P == 2) _tile_dpbf16ps(2, 4, 6);
    if constexpr (P == 3) _tile_dpbf16ps(3, 4, 7);
  } else {
    if constexpr (P == 0) _tile_dpbf16ps(0, 5, 6);
    if constexpr (P == 1) _tile_dpbf16ps(1, 5, 7);
    if constexpr (P == 2) _tile_dpbf16ps(2, 5, 6);
    if constexpr (P == 3) _tile_dpbf16ps(3, 5, 7);
  }
}

template <int P>
inline void c_tile_load(const float* c, long ld_bytes) {
  if constexpr (P == 0) _tile_loadd(0, c, ld_bytes);
  if constexpr (P == 1) _tile_loadd(1, c, ld_bytes);
  if constexpr (P == 2) _tile_loadd(2, c, ld_bytes);
  if constexpr (P == 3) _tile_loadd(3, c, ld_bytes);
}
template <int P>
inline void c_tile_store(float* c, long ld_bytes) {
  if constexpr (P == 0) _tile_stored(0, c, ld_bytes);
  if constexpr (P == 1) _tile_stored(1, c, ld_bytes);
  if constexpr (P == 2) _tile_stored(2, c, ld_bytes);
  if constexpr (P == 3) _tile_stored(3, c, ld_bytes);
}
template <int P>
inline void c_tile_zero() {
  if constexpr (P == 0) _tile_zero(0);
  if constexpr (P == 1) _tile_zero(1);
  if constexpr (P == 2) _tile_zero(2);
  if constexpr (P == 3) _tile_zero(3);
}

// One group of `Panels` panels starting at `panel`, over all of K.
struct Group {
  const PackedMxfp4Shape& s;
  const PackedMxfp4View& w;
  const Mxfp4LineLookup& lookup;
  int panel;

  const std::uint8_t* codes(int p, int kb) const {
    return w.codes + (static_cast<std::size_t>(panel + p) * s.kblocks + kb) * kMxfp4BlockCodeBytes;
  }
  const std::uint8_t* exponents(int p, int kb) const {
    return w.exponents + (static_cast<std::size_t>(panel + p) * s.kblocks + kb) * kMxfp4BlockExponentBytes;
  }
  // Panel p's block kb into dst, asking for its codes kCodePrefetchBlocks blocks on.
  void dequantize(int p, int kb, bf16* dst) const {
    const std::uint8_t* c = codes(p, kb);
    if (kb + kCodePrefetchBlocks < s.kblocks)
      for (std::size_t line = 0; line < kMxfp4BlockCodeBytes; line += 64)
        _mm_prefetch(reinterpret_cast<const char*>(c + kCodePrefetchBlocks * kMxfp4BlockCodeBytes + line), _MM_HINT_T0);
    lookup.block(c, exponents(p, kb), dst);
  }
};

// k-step kb: A into register A, each panel's product from `now`, each followed by the
// dequantization of the panel's block kb + 1 into `next` (when there is one).
template <int Panels, int A>
inline void k_step(const Group& grp, const bf16* a, long a_row_bytes, int kb, bf16 (*now)[kBlockElements],
                   bf16 (*next)[kBlockElements]) {
  const bool more = kb + 1 < grp.s.kblocks;
  load_a<A>(a, a_row_bytes);
  product<0, A>(now[0]);
  if (more) grp.dequantize(0, kb + 1, next[0]);
  if constexpr (Panels > 1) {
    product<1, A>(now[1]);
    if (more) grp.dequantize(1, kb + 1, next[1]);
  }
  if constexpr (Panels > 2) {
    product<2, A>(now[2]);
    if (more) grp.dequantize(2, kb + 1, next[2]);
  }
  if constexpr (Panels > 3) {
    product<3, A>(now[3]);
    if (more) grp.dequantize(3, kb + 1, next[3]);
  }
  // The tile loads are asm statements the compiler does not see read memory: the next k-step's
  // must come after this one's stores.
  __asm__ volatile("" ::: "memory");
}

template <int Panels>
void group_product(const GemmBf16Args& g, const Group& grp, StepBlocks& blocks) {
  float* const c = g.c + static_cast<std::size_t>(grp.panel - g.panel_begin) * kPanelColumns;
  const long ldc_bytes = static_cast<long>(g.ldc * sizeof(float));
  auto each_panel = [](auto f) {
    f(std::integral_constant<int, 0>{});
    if constexpr (Panels > 1) f(std::integral_constant<int, 1>{});
    if constexpr (Panels > 2) f(std::integral_constant<int, 2>{});
    if constexpr (Panels > 3) f(std::integral_constant<int, 3>{});
  };
  if (g.accumulate) {
    each_panel([&](auto p) { c_tile_load<decltype(p)::value>(c + p * kPanelColumns, ldc_bytes); });
  } else {
    each_panel([&](auto p) { c_tile_zero<decltype(p)::value>(); });
  }
  const ARows a = a_rows(g, 0);
  const long a_row_bytes = static_cast<long>(a.row_stride * sizeof(bf16));
  const int kblocks = grp.s.kblocks;
  if (kblocks > 0) {
    each_panel([&](auto p) { grp.dequantize(p, 0, blocks.block[0][p]); });
    __asm__ volatile("" ::: "memory");
    auto a_at = [&](int kb) { return a.p + static_cast<std::size_t>(kb) * a.kblock_stride; };
    int kb = 0;
    for (; kb + 2 <= kblocks; kb += 2) {
      k_step<Panels, 4>(grp, a_at(kb), a_row_bytes, kb, blocks.block[0], blocks.block[1]);
      k_step<Panels, 5>(grp, a_at(kb + 1), a_row_bytes, kb + 1, blocks.block[1], blocks.block[0]);
    }
    if (kb < kblocks) k_step<Panels, 4>(grp, a_at(kb), a_row_bytes, kb, blocks.block[0], blocks.block[1]);
  }
  each_panel([&](auto p) { c_tile_store<decltype(p)::value>(c + p * kPanelColumns, ldc_bytes); });
}

// The first row block (up to 32 rows) of one pair (or last single panel) of a many-row product,
// the products of each k-step issued before the dequantization of the pair's next blocks, which
// go into `pair` (the layout gemm_bf16 reads: the first panel's k-blocks, then the second's) for
// the other row blocks to read from L2.
template <bool TwoRowTiles, bool TwoPanels>
void pair_first_block(const GemmBf16Args& g, const Group& grp, bf16* pair) {
  float* const c = g.c + static_cast<std::size_t>(grp.panel - g.panel_begin) * kPanelColumns;
  const long ldc_bytes = static_cast<long>(g.ldc * sizeof(float));
  // C tile t (tile_block.hpp's numbering): rows 16 (t / 2) on, panel t % 2.
  auto c_tile = [&](int t) {
    return c + static_cast<std::size_t>(16 * (t / 2)) * g.ldc + static_cast<std::size_t>(t % 2) * kPanelColumns;
  };
  if (g.accumulate) load_c_tiles<TwoRowTiles, TwoPanels>(c_tile, ldc_bytes);
  else zero_c_tiles<TwoRowTiles, TwoPanels>();
  const int kblocks = grp.s.kblocks;
  bf16* const second = pair + static_cast<std::size_t>(kblocks) * kBlockElements;
  auto block_of = [&](int p, int kb) { return (p == 0 ? pair : second) + static_cast<std::size_t>(kb) * kBlockElements; };
  const ARows a0 = a_rows(g, 0);
  const ARows a1 = a_rows(g, TwoRowTiles ? 16 : 0);
  const long a_row_bytes = static_cast<long>(a0.row_stride * sizeof(bf16));
  if (kblocks > 0) {
    grp.dequantize(0, 0, block_of(0, 0));
    if constexpr (TwoPanels) grp.dequantize(1, 0, block_of(1, 0));
    __asm__ volatile("" ::: "memory");
  }
  for (int kb = 0; kb < kblocks; ++kb) {
    const bool more = kb + 1 < kblocks;
    _tile_loadd(4, a0.p + static_cast<std::size_t>(kb) * a0.kblock_stride, a_row_bytes);
    if constexpr (TwoRowTiles) _tile_loadd(5, a1.p + static_cast<std::size_t>(kb) * a1.kblock_stride, a_row_bytes);
    _tile_loadd(6, block_of(0, kb), 64);
    if constexpr (TwoPanels) _tile_loadd(7, block_of(1, kb), 64);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (TwoPanels) _tile_dpbf16ps(1, 4, 7);
    if (more) grp.dequantize(0, kb + 1, block_of(0, kb + 1));
    if constexpr (TwoRowTiles) {
      _tile_dpbf16ps(2, 5, 6);
      if constexpr (TwoPanels) _tile_dpbf16ps(3, 5, 7);
    }
    if constexpr (TwoPanels) {
      if (more) grp.dequantize(1, kb + 1, block_of(1, kb + 1));
    }
    __asm__ volatile("" ::: "memory");
  }
  store_c_tiles<TwoRowTiles, TwoPanels>(c_tile, ldc_bytes);
}

void require_tiles(const char* who) {
  // A tile instruction without the permission would kill the process with SIGILL.
  if (!tile_instructions_usable()) fail_tiles_unusable(who);
}

}  // namespace

void gemm_mxfp4_few_rows_amx(const GemmBf16Args& g, const PackedMxfp4Shape& s, const PackedMxfp4View& w) {
  if (g.m <= 0 || g.panel_end <= g.panel_begin) return;
  if (g.m > kMxfp4FewRowsMaxRows)
    fail_kernel_argument("gemm_mxfp4_few_rows_amx", g.m, "rows, more than one row tile");
  require_tiles("gemm_mxfp4_few_rows_amx");
  thread_local StepBlocks blocks;
  const Mxfp4LineLookup lookup;
  __asm__ volatile("" ::: "memory");
  ensure_tile_config(make_tile_config(g.m, g.m));
  for (int panel = g.panel_begin; panel < g.panel_end; panel += kGroupPanels) {
    const Group grp{s, w, lookup, panel};
    switch (std::min(kGroupPanels, g.panel_end - panel)) {
      case 4: group_product<4>(g, grp, blocks); break;
      case 3: group_product<3>(g, grp, blocks); break;
      case 2: group_product<2>(g, grp, blocks); break;
      default: group_product<1>(g, grp, blocks); break;
    }
  }
  __asm__ volatile("" ::: "memory");
}

void gemm_mxfp4_pair_first_block_amx(const GemmBf16Args& g, const PackedMxfp4Shape& s, const PackedMxfp4View& w, int q0, int q1,
                                     bf16* pair) {
  if (g.m <= 0 || q1 <= q0) return;
  if (q1 - q0 > 2) fail_kernel_argument("gemm_mxfp4_pair_first_block_amx", "more than a pair of panels");
  require_tiles("gemm_mxfp4_pair_first_block_amx");
  const Mxfp4LineLookup lookup;
  const Group grp{s, w, lookup, q0};
  const int rows = std::min(g.m, kMxfp4PairFirstBlockRows);
  __asm__ volatile("" ::: "memory");
  if (rows > 16) {
    ensure_tile_config(make_tile_config(16, rows - 16));
    if (q1 - q0 == 2) pair_first_block<true, true>(g, grp, pair);
    else pair_first_block<true, false>(g, grp, pair);
  } else {
    ensure_tile_config(make_tile_config(rows, rows));
    if (q1 - q0 == 2) pair_first_block<false, true>(g, grp, pair);
    else pair_first_block<false, false>(g, grp, pair);
  }
  __asm__ volatile("" ::: "memory");
}

}  // namespace tilemoe::kernels
