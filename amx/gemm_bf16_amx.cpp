// AMX-BF16 GEMM: the prefill hot path (m >= kAmxMinRows rows per expert in the kernel table).
// The 2x2 block's tile steps and C tile moves are in tile_block.hpp, shared with the int8 kernel.
//
// Tile registers (palette 1, every row 64 bytes), 2×2 blocking = 32 rows × 32 columns:
//   tmm0: C rows [0,16)  × panel p      tmm1: C rows [0,16)  × panel p+1     (16 f32 a row)
//   tmm2: C rows [16,32) × panel p      tmm3: C rows [16,32) × panel p+1
//   tmm4: A rows [0,16)  × one k-block  tmm5: A rows [16,32) × one k-block   (32 bf16 a row)
//   tmm6: B panel p, one k-block        tmm7: B panel p+1, one k-block       (16 k-pairs × 16 cols × 2)
// A packed block is exactly one B tile, so B loads are contiguous 1 KiB reads; each k-block
// costs 2 A + 2 B tile loads for 4 TDPBF16PS. One panel left over uses tmm0/2/4/5/6 only.
//
// m tail: rows are never padded or copied. Whole 32-row blocks run with a 16/16-row tile
// configuration; the last m % 32 rows run in a second pass with a configuration whose C and A
// tiles have exactly that many rows (16 + r or r alone), so tile loads never read a row >= m and
// tile stores never write one. C tiles load and store straight from/to C (a C tile row is one
// panel's 16 floats), so no stack buffer is needed for any ldc or alignment.
//
// The configuration changes only between those two passes; panels are processed in groups
// whose weights stay in L2 so that the tail pass re-reads them from L2, not memory. Experts of
// 33-128 rows run panel pairs outside instead (pairs_outside), as the int8 kernel does. Experts
// of at most 16 rows run 1 x 4 blocks where one_row_tile_block() says quads (quad_block).
//
// A may come in tile order (pack_rows_as_tiles): each A tile load is then one contiguous 1 KiB.
// On the device, the gate_up phase (48 and 384 rows per expert, K = 2048, 16 threads) ran 20-27 %
// faster that way than from rows at a 4 KiB stride, whose 16 lines all map to one L1 set;
// padding the stride to 4 KiB + 64 gained about half as much.
//
// Tried on a 16-core AMX Xeon and dropped, as they were no faster within run-to-run noise
// (~4-4.5 TFLOP/s at m >= 64, K = 2048, N = 1408, 16 threads): sweeping K in chunks of 4-16
// k-blocks shared by all row blocks (partial sums kept in C), copying A into tile order in a
// stack buffer, stream loads (TILELOADDT1) for B, and 256 KiB - 1 MiB panel groups.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "amx/gemm_bf16.hpp"
#include "amx/isa.hpp"
#include "amx/kernel_errors.hpp"
#include "amx/one_row_tile_block.hpp"
#include "amx/pack_bf16.hpp"
#include "amx/pair_order.hpp"
#include "amx/prefetch.hpp"
#include "amx/tile_block.hpp"
#include "amx/tile_config.hpp"
#include "amx/tile_intrinsics.hpp"

namespace tilemoe::kernels {
namespace {

static_assert(kBlockElements * sizeof(bf16) == kTileBlockBytes, "prefetch_tile_block_* ask for one packed block");

constexpr int kTileRows = 16;
constexpr int kBlockRows = 2 * kTileRows;
constexpr int kTileRowBytes = 64;
// B blocks are prefetched this many k-blocks ahead into L1 on the first pass over a panel pair
// (later passes find them in L2), and kL2AheadBlocks ahead into L2, so that more of the core's
// misses are in flight than the L1 requests alone keep (sessions 33-34: the L2 requests took the
// forward at 128 and 512 tokens 1-4 % faster in 13 of 14 pairs). The distances were 4 and 16 until
// session 69, when distances taking turns call by call as cases of one process (held LoRA r=16,
// the DeepSeek-V2-Lite shape) gave: on two Emerald Rapids machines, four processes, 2 / 8 against
// 4 / 16 1.6-3.2 % faster at 128 tokens and 0.5-2.8 % at 512, 8 pairs of 8 (1 / 4 about the same,
// 2 / 16 and 4 / 8 each faster at one of the two, 8 / 32 5 % slower); on a Sapphire Rapids machine,
// two processes, level within 1 %. Session 33's "+16-21 % on another instance" for L1 requests 2
// ahead came from separate processes of two builds, which differ by that much on these machines.
constexpr int kPrefetchBlocks = 2;
constexpr int kL2AheadBlocks = 8;
// Panel groups: the weights of one group are re-read by every 32-row block and by the tail pass.
constexpr std::size_t kGroupBytes = 512 * 1024;
// Experts of 33-128 rows run panel pairs outside and row blocks inside (pair_order.hpp): with
// row blocks outside, the rows after the first 32 ran over a whole group from L2 while nothing
// streamed. On the device (DeepSeek-V2-Lite, held LoRA r=16, both orders as cases taking turns in
// one process, session 40) 512 tokens (48 rows an expert) ran 1.4-3.5 % faster in six pairs of
// seven (the seventh even), 1024 tokens (96 rows) 2.6-3.5 % in three of four (+1.2 % in the
// other); 256 tokens (24 rows, one row block either way) the same. Session 26 found no gain at 512
// tokens, on a tree that did not yet ask for B ahead into L2 (kL2AheadBlocks).

struct Operand {
  const bf16* a;
  std::size_t row_tile_stride;  // elements from one 16-row A tile to the next
  std::size_t kblock_stride;    // elements from one k-block of an A tile to the next
  long lda_bytes;               // the A tile's row stride
  const bf16* packed;
  std::size_t panel_stride;  // elements between consecutive panels
  int kblocks;
};

// All k-blocks of one operand into the C tiles.
template <bool TwoRowTiles, bool TwoPanels>
inline void k_sweep(const Operand& op, int row0, int panel, bool prefetch_b, const NextPair& next = {}) {
  const bf16* a0 = op.a + static_cast<std::size_t>(row0 / kTileRows) * op.row_tile_stride;
  const bf16* b0 = op.packed + panel * op.panel_stride;
  for (int kb = 0; kb < op.kblocks; ++kb) {
    const bf16* bk = b0 + static_cast<std::size_t>(kb) * kBlockElements;
    if (prefetch_b) {
      prefetch_tile_block_l1(bk + kPrefetchBlocks * kBlockElements);
      if constexpr (TwoPanels) prefetch_tile_block_l1(bk + op.panel_stride + kPrefetchBlocks * kBlockElements);
      prefetch_tile_block_l2(bk + kL2AheadBlocks * kBlockElements);
      if constexpr (TwoPanels) prefetch_tile_block_l2(bk + op.panel_stride + kL2AheadBlocks * kBlockElements);
    }
    next.ask(kb);
    const bf16* ak = a0 + static_cast<std::size_t>(kb) * op.kblock_stride;
    tile_step<TileProduct::bf16, TwoRowTiles, TwoPanels>(ak, op.row_tile_stride * sizeof(bf16), op.lda_bytes, bk,
                                                         op.panel_stride * sizeof(bf16));
  }
}

struct Job {
  Operand first, second;
  bool has_second;
  float* c;
  long ldc_bytes;
  std::size_t ldc;
  int panel_begin;
  bool accumulate;
};

// Rows [row0, row0 + configured rows) × panels p (and p+1): C tiles in, K sweeps of both
// products, C tiles out.
// (next: the next pair's first weights, asked for during the main product's sweep.)
template <bool TwoRowTiles, bool TwoPanels>
void tile_block(const Job& job, int row0, int panel, bool prefetch_b, const NextPair& next = {}) {
  float* const c0 = job.c + row0 * job.ldc + (panel - job.panel_begin) * kPanelColumns;
  // C tile t: rows [16 (t / 2), +16) x the pair's panel t % 2 (formed only for tiles that exist).
  auto c_tile = [&](int t) { return c0 + static_cast<std::size_t>(t / 2) * kTileRows * job.ldc + (t % 2) * kPanelColumns; };
  if (job.accumulate) {
    load_c_tiles<TwoRowTiles, TwoPanels>(c_tile, job.ldc_bytes);
  } else {
    zero_c_tiles<TwoRowTiles, TwoPanels>();
  }
  k_sweep<TwoRowTiles, TwoPanels>(job.first, row0, panel, prefetch_b, next);
  if (job.has_second) k_sweep<TwoRowTiles, TwoPanels>(job.second, row0, panel, prefetch_b);
  store_c_tiles<TwoRowTiles, TwoPanels>(c_tile, job.ldc_bytes);
}

// Row blocks outside, panel pairs inside: a 32-row block of A (128 KiB at K = 2048) stays in L2
// while it meets every pair of the group, and the group's weights (kGroupBytes) are re-read from L2
// by each block. With pairs outside, every pair streamed all of A, which at 384 rows per expert
// (4096 tokens of DeepSeek-V2-Lite, 1.5 MiB of A) no longer fits L2 beside the weights: on the
// device, the same process taking turns, 4096 tokens ran 84.6 / 100.2 ms against 93.9 / 110.0.
template <bool TwoRowTiles>
void panel_pairs(const Job& job, int row_begin, int row_end, int p_begin, int p_end, bool first_pass) {
  for (int row = row_begin; row < row_end; row += kBlockRows) {
    for (int p = p_begin; p < p_end; p += 2) {
      const bool prefetch_b = first_pass && row == row_begin;
      if (p + 1 < p_end) {
        tile_block<TwoRowTiles, true>(job, row, p, prefetch_b);
      } else {
        tile_block<TwoRowTiles, false>(job, row, p, prefetch_b);
      }
    }
  }
}

// One row block of pairs_outside, rows [row, row + rows) (1-32), over pair p (one panel if !two).
void pair_block(const Job& job, int row, int rows, int p, bool two, bool prefetch_b, const NextPair& next) {
  if (rows > kTileRows) {
    ensure_tile_config(make_tile_config(kTileRows, rows - kTileRows));
    if (two) return tile_block<true, true>(job, row, p, prefetch_b, next);
    return tile_block<true, false>(job, row, p, prefetch_b, next);
  }
  ensure_tile_config(make_tile_config(rows, rows));
  if (two) return tile_block<false, true>(job, row, p, prefetch_b, next);
  tile_block<false, false>(job, row, p, prefetch_b, next);
}

// 33-128 rows (kPairsOutsideMaxRows), in pair_order.hpp's order.
void pairs_outside(const Job& job, int m, int p_begin, int p_end) {
  const int count = (m + kBlockRows - 1) / kBlockRows;
  const std::size_t panel_bytes = job.first.panel_stride * sizeof(bf16);
  auto start_pair = [&](int p) {
    if (p + 2 >= p_end || job.first.kblocks == 0) return NextPair{};
    return NextPair{job.first.packed + static_cast<std::size_t>(p + 2) * job.first.panel_stride, panel_bytes,
                    std::min(job.first.kblocks, kNextPairBlocks)};
  };
  for_each_pair_block(count, p_begin, p_end, start_pair, [&](int b, int p, bool two, bool first, const NextPair& next) {
    pair_block(job, b * kBlockRows, std::min(kBlockRows, m - b * kBlockRows), p, two, first, next);
  });
}

// One row tile (m <= 16) over four panels at once, for OneRowTileBlock::quads
// (one_row_tile_block.hpp): C in tmm0-3, A in tmm4, B through tmm5-7 (the configuration gives
// tmm5 16 rows), so that a core streams four panels as the decode kernel does, with one A load
// per four products instead of one per two. tmm5 takes the fourth panel's B after the first
// product has read it: tile registers are not renamed, so that load waits for the product.
inline void k_sweep_quad(const Operand& op, int panel, bool prefetch_b) {
  const bf16* b0 = op.packed + panel * op.panel_stride;
  const std::size_t ps = op.panel_stride;
  const std::size_t psb = ps * sizeof(bf16);
  for (int kb = 0; kb < op.kblocks; ++kb) {
    const bf16* bk = b0 + static_cast<std::size_t>(kb) * kBlockElements;
    if (prefetch_b) {
      for (int q = 0; q < 4; ++q) {
        prefetch_tile_block_l1(bk + q * ps + kPrefetchBlocks * kBlockElements);
        prefetch_tile_block_l2(bk + q * ps + kL2AheadBlocks * kBlockElements);
      }
    }
    const char* ak = reinterpret_cast<const char*>(op.a + static_cast<std::size_t>(kb) * op.kblock_stride);
    const char* bc = reinterpret_cast<const char*>(bk);
    _tile_loadd(4, ak, op.lda_bytes);
    _tile_loadd(5, bc, 64);
    _tile_loadd(6, bc + psb, 64);
    _tile_loadd(7, bc + 2 * psb, 64);
    _tile_dpbf16ps(0, 4, 5);
    _tile_dpbf16ps(1, 4, 6);
    _tile_dpbf16ps(2, 4, 7);
    _tile_loadd(5, bc + 3 * psb, 64);
    _tile_dpbf16ps(3, 4, 5);
  }
}

// Rows [0, configured rows) x panels [panel, panel + 4): C tiles in, K sweeps of both products,
// C tiles out.
void quad_block(const Job& job, int panel, bool prefetch_b) {
  float* const c0 = job.c + (panel - job.panel_begin) * kPanelColumns;
  // tile_block.hpp's C moves for all four tiles: here tile t is panel panel + t of the one row tile.
  auto c_tile = [&](int t) { return c0 + t * kPanelColumns; };
  if (job.accumulate) {
    load_c_tiles<true, true>(c_tile, job.ldc_bytes);
  } else {
    zero_c_tiles<true, true>();
  }
  k_sweep_quad(job.first, panel, prefetch_b);
  if (job.has_second) k_sweep_quad(job.second, panel, false);
  store_c_tiles<true, true>(c_tile, job.ldc_bytes);
}

TileConfig quad_tile_config(int rows) {
  TileConfig cfg = make_tile_config(rows, rows);
  cfg.rows[5] = 16;  // a B tile here, an A tile of a second row tile in the pairs' configuration
  return cfg;
}

Operand make_operand(const bf16* a, std::size_t lda, bool tiles, const bf16* packed, int k_padded, std::size_t b_panel_stride = 0) {
  const int kblocks = k_padded / kBlockK;
  const std::size_t panel_stride = second_panel_stride(k_padded, b_panel_stride);
  if (tiles) return Operand{a, panel_stride, kBlockElements, kTileRowBytes, packed, panel_stride, kblocks};
  return Operand{a, kTileRows * lda, kBlockK, static_cast<long>(lda * sizeof(bf16)), packed, panel_stride, kblocks};
}

}  // namespace

void gemm_bf16_amx(const GemmBf16Args& args) {
  if (args.m <= 0 || args.panel_end <= args.panel_begin) return;
  if (!tile_instructions_usable()) {
    // A tile instruction without the permission would kill the process with SIGILL.
    fail_tiles_unusable("gemm_bf16_amx");
  }
  // The tile instructions are asm statements that do not tell the compiler what they read.
  __asm__ volatile("" ::: "memory");

  Job job{};
  job.first = make_operand(args.a, args.lda, args.a_tiles, args.packed_b, args.k_padded);
  job.has_second = args.packed_b2 != nullptr && args.k2_padded > 0;
  if (job.has_second) job.second = make_operand(args.a2, args.lda2, false, args.packed_b2, args.k2_padded, args.b2_panel_stride);
  job.c = args.c;
  job.ldc = args.ldc;
  job.ldc_bytes = static_cast<long>(args.ldc * sizeof(float));
  job.panel_begin = args.panel_begin;
  job.accumulate = args.accumulate;

  const int m_full = args.m / kBlockRows * kBlockRows;
  const int tail = args.m - m_full;
  const bool quads = m_full == 0 && one_row_tile_block() == OneRowTileBlock::quads;
  // Groups are sized by the main product's weights. A LoRA's B (1-2 KiB a panel) is left out:
  // counted, it made 64 KiB panels into groups of 6 and 2 instead of 8, so that every row block
  // of A was streamed twice per 8-panel item. On the device at 4096 tokens (builds taking turns,
  // three rounds) the gate_up phase's LoRA cost went from +3.2 to +2.4 ms.
  const std::size_t panel_bytes = (job.first.kblocks > 0 ? job.first.panel_stride : job.second.panel_stride) * sizeof(bf16);
  const std::size_t group_fit = std::min<std::size_t>(panel_bytes == 0 ? 2 : kGroupBytes / panel_bytes, 1u << 20);
  const int group = static_cast<int>(std::max<std::size_t>(2, group_fit & ~std::size_t{1}));  // whole pairs

  if (args.m > kBlockRows && args.m <= kPairsOutsideMaxRows) {
    pairs_outside(job, args.m, args.panel_begin, args.panel_end);
    __asm__ volatile("" ::: "memory");
    return;
  }
  for (int g0 = args.panel_begin; g0 < args.panel_end; g0 += group) {
    const int g1 = std::min(args.panel_end, g0 + group);
    if (m_full > 0) {
      ensure_tile_config(make_tile_config(kTileRows, kTileRows));
      panel_pairs<true>(job, 0, m_full, g0, g1, true);
    }
    if (tail > kTileRows) {
      ensure_tile_config(make_tile_config(kTileRows, tail - kTileRows));
      panel_pairs<true>(job, m_full, args.m, g0, g1, m_full == 0);
    } else if (tail > 0) {
      int p = g0;
      if (quads) {
        ensure_tile_config(quad_tile_config(tail));
        for (; p + 4 <= g1; p += 4) quad_block(job, p, true);
      }
      if (p < g1) {
        ensure_tile_config(make_tile_config(tail, tail));
        panel_pairs<false>(job, m_full, args.m, p, g1, m_full == 0);
      }
    }
  }
  __asm__ volatile("" ::: "memory");
}

void release_amx_tiles() {
  if (!tile_instructions_usable()) return;
  _tile_release();
}

}  // namespace tilemoe::kernels
