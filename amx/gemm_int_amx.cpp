// AMX-INT8 integer GEMM: the prefill path of int8/int4 weights (rows >= kAmxMinRows per expert).
//
// Tiles as in gemm_bf16_amx.cpp (tile_block.hpp), 2×2 blocking = 32 rows × 32 columns: tmm0-3 the int32 C tiles,
// tmm4/5 two A tiles (16 rows × 64 int8), tmm6/7 two B tiles (one packed int8 block each).
// TDPBSSD multiplies signed by signed bytes, so no bias is needed here. The C tiles hold the
// exact int32 sums of one scale group; at each group's end they go through a 4 KiB stack buffer
// and are scaled in f32: a single group (int8, int4 in column-scale form) straight into C during
// the next block's k-steps (DeferredFlush), int4's groups into a 4 KiB f32 block on the stack
// that goes to C once, after the last group.
//
// int4: each panel group's codes (up to 128 rows, each panel pair's) are unpacked into int8
// blocks in a thread-local buffer (nibble - 8), which stays in L2 while every row block passes over
// it; the first row block to meet a pair unpacks its next k-block during each k-step's products.
// When the group scales are integer multiples of one scale per column (pack_int.hpp), the unpack
// multiplies each code by its group's multiple and the whole of K is one group, as for int8:
// on the device (two rounds, one call) that took int4 g128 at 4096 tokens from 73.4-73.8 to
// 59.6-63.3 ms (gate_up 43.0 -> 33.6-36.4) and at 512 tokens from 10.9-11.0 to 9.6-9.7, level with
// int8. Otherwise groups of 32 are shorter than a 64-k tile, so the kernel table sends int4 at
// group 32 to the AVX512-VNNI kernel.
//
// A by rows or in tile order (pack_int.hpp), where each A tile load is one contiguous 1 KiB.
// The flush (scaling, DeferredFlush) is in int_flush_amx.hpp, int4's unpacking in int4_unpack_amx.hpp.
//
// The bf16 second product (a LoRA term) runs on the same tiles once a block's integer sums are
// out of them, with the same configuration (64-byte rows: 32 bf16 or 64 int8), and is added in
// the last group's flush: C is written once, where a separate bf16 pass would read and write it
// again. With GemmIntArgs::y, a single group's flush writes the result as bf16 into y's rows and
// C is not written at all (the forward's down items: no pass of their own converts C into y). On
// the device (DeepSeek-V2-Lite, held LoRA r=16, both forms as cases taking turns, two processes)
// int8 at 4096 tokens took 4.6 / 4.8 % less time (every pair in favour), at 512 tokens 0.5 / 1.9 %;
// int4 g128 at 4096 about 5 % (one pair of two).
//
// m tail: as in the bf16 kernel, whole 32-row blocks run with a 16/16 tile configuration and the
// last m % 32 rows with one whose tiles have exactly that many rows. Row blocks go outside the
// panel pairs, except for int8 at 33-128 rows and int4 up to 128 (pairs_outside, below).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "amx/immintrin_gcc12.hpp"

#include "amx/aligned_vector.hpp"
#include "amx/gemm_int.hpp"
#include "amx/int4_unpack_amx.hpp"
#include "amx/int_flush_amx.hpp"
#include "amx/isa.hpp"
#include "amx/kernel_errors.hpp"
#include "amx/pack_bf16.hpp"
#include "amx/pair_order.hpp"
#include "amx/prefetch.hpp"
#include "amx/tile_block.hpp"
#include "amx/tile_config.hpp"
#include "amx/tile_intrinsics.hpp"

namespace tilemoe::kernels {
namespace {

constexpr int kTileRows = 16;
constexpr int kBlockRows = 2 * kTileRows;
constexpr long kTileRowBytes = 64;
constexpr std::size_t kBlockBytes = kTileBlockBytes;  // one int8 B tile (prefetch.hpp)
// Panel groups: the codes of one group (int8 form) are re-read by every 32-row block.
constexpr std::size_t kGroupBytes = 512 * 1024;

struct Job {
  const GemmIntArgs* g;
  const std::uint8_t* b;     // int8 blocks; panel `b_panel0` first
  int b_panel0;
  std::size_t panel_stride;  // bytes between panels in b
  int kblocks, group_blocks;
  const float* scales;  // [panel][group][16]
  int groups;
  DeferredFlush* deferred = nullptr;  // one scale group: each block's flush runs in the next block
};

// int8 B blocks are prefetched into L2 this many k-blocks ahead on the first pass over a panel
// pair, which reads them from memory (later passes find them in L2). Without it the tile loads
// wait on memory: on the device at 512 tokens (48 rows per expert) 16 blocks ahead took the
// layer from 10.9 to 8.8 ms, 8 blocks into L1 to 9.4 ms. int4's B is the unpacked copy, in L2.
constexpr std::size_t kPrefetchBlocks = 16;
// int8 B blocks this many k-steps ahead are also asked for into L1, on every pass, so that the
// tile loads find them there and not in L2. On the device (DeepSeek-V2-Lite, with and without as
// cases taking turns in one process, four calls) int8 took 9-10 % less time at 128 tokens, about
// 2 % less at 512 and 1024 (pairs from +1 to -6 %) and 1-2 % less at 4096. int4's B, the unpacked
// copy this core just wrote, goes without: at 4096 tokens it was 5-7 % slower with it, and no
// faster at 128 or 512.
constexpr std::size_t kL1AheadBlocks = 2;

// int8 experts of 33 to kPairsOutsideMaxRows rows and int4 experts of up to that many (A at most
// 256 KiB of int8 at K = 2048) run panel pairs outside and row blocks inside (pair_order.hpp):
// int8's first row block streams a pair's B from memory (int4 unpacks the pair first), the others
// re-read it hot, and the last one sends the next pair's first kNextPairBlocks KiB a panel (int4:
// its codes) to L2, so that the core's memory stream goes on while it computes from cache. Row blocks outside,
// the tail rows of a panel group ran after all its pairs' 32-row blocks, computing from L2 while
// nothing streamed, and int4 unpacked a whole group before any product. On the device (DeepSeek-
// V2-Lite; old and new orders in one process taking turns call by call, three rounds, every round
// in favour): int8 at 512 tokens (about 48 rows an expert) 9.00 -> 7.99 ms (8.30 without the snake
// order), at 1024 tokens (about 96 rows) 12.19 -> 11.45; int4 g128 at 512 tokens 7.25 -> 6.93, at
// 128 tokens (about 12 rows) 4.99 -> 4.49, at 1024 tokens 14.00 -> 13.06. One int8 row block (32
// rows or fewer) already streams B as it computes. Up to 1 MiB of A instead (384 rows at 4096
// tokens) made int8 at 4096 tokens slower in the same kind of comparison (37.8 -> 40.1 and 42.6 ->
// 43.7 ms), and int4 no better. The bf16 kernel runs the same order from session 40
// (gemm_bf16_amx.cpp), where it first gained nothing at 512 tokens (14.39 / 14.51 ms).
template <bool TwoRowTiles, bool TwoPanels>
void tile_block(const Job& job, int row0, int rows0, int rows1, int panel, bool prefetch, const NextPair& next = {},
                const PairUnpack* unpack = nullptr) {
  const GemmIntArgs& g = *job.g;
  // By rows: tile 2 starts 16 rows down. In tile order: the row tile's blocks are 1 KiB apart
  // along K and the next row tile's start kblocks blocks later.
  const std::int8_t* a0 = g.a_tiles ? g.a + static_cast<std::size_t>(row0 / kTileRows) * job.kblocks * kBlockBytes : g.a + row0 * g.lda;
  const long lda_bytes = g.a_tiles ? kTileRowBytes : static_cast<long>(g.lda);
  const std::size_t a_kstep = g.a_tiles ? kBlockBytes : kIntBlockK;
  const std::size_t a_second = g.a_tiles ? static_cast<std::size_t>(job.kblocks) * kBlockBytes : kTileRows * g.lda;
  const std::uint8_t* b0 = job.b + static_cast<std::size_t>(panel - job.b_panel0) * job.panel_stride;
  const bool second = g.has_second();
  const bool ask_l1 = g.shape.bits == 8;
  // Two sets of group sums: a group's are scaled (AVX-512) only after the next group's tile
  // products are issued, so that the TMUL works on those while the flush runs (int4 has one
  // group per 128 inputs: 16 flushes of a 2048-long row). The groups still add up in order.
  alignas(64) std::int32_t buf[2][4][kTileRows * 16];
  // Several groups add up in a contiguous f32 block, written to C once at the end. Added into C
  // itself, a block whose rows lie 2 KiB apart (int4 items of 32 panels) maps its 64 lines onto 4
  // L1 sets and evicts itself at every group: on the device this block took int4 g128 at 4096
  // tokens from 83-84 to 71-72 ms (g64: 102 to 82). One group (int8) goes straight into C.
  alignas(64) float acc[4][kTileRows * 16];
  // The bf16 second product (LoRA) of the block, made with the same tile configuration (rows of
  // 64 bytes: 32 bf16 as 64 int8) once the integer sums are out of the C tiles.
  alignas(64) float extra[4][kTileRows * 16];
  const bool direct = job.groups == 1;
  const std::size_t ldc = g.ldc;
  float* const c0 = g.c + static_cast<std::size_t>(row0) * ldc + static_cast<std::size_t>(panel - g.panel_begin) * 16;
  // One scale group writes a bf16 result (GemmIntArgs::y) from its flush; its rows of y (a line a
  // row for a pair) are asked for now, a block before the flush stores into them.
  const bool to_y = direct && g.y != nullptr && !g.accumulate;
  bf16* const y0 = to_y ? g.y + static_cast<std::size_t>(row0) * g.ldy + static_cast<std::size_t>(panel - g.panel_begin) * 16 : nullptr;
  if (to_y) {
    const int rows = TwoRowTiles ? rows0 + rows1 : rows0;
    for (int i = 0; i < rows; ++i) {
      const bf16* row = y0 + static_cast<std::size_t>(i) * g.ldy;
      __builtin_prefetch(row, 1);
      __builtin_prefetch(row + (TwoPanels ? 31 : 15), 1);
    }
  }
  const float* const sa = g.a_scale + row0;
  const float* const scales = job.scales;
  const int groups = job.groups;
  // Tile t: rows [16 * (t / 2), +16) x panel panel + t % 2.
  auto flush_one = [&](int grp, int t) {
    const int r = t / 2 * kTileRows, rows = t < 2 ? rows0 : rows1, p = panel + t % 2;
    const __m512 scale = _mm512_loadu_ps(scales + (static_cast<std::size_t>(p) * groups + grp) * 16);
    const float* add_extra = second && grp == groups - 1 ? extra[t] : nullptr;
    if (to_y) {
      scale_sums_into_bf16(buf[grp & 1][t], rows, scale, sa + r, y0 + static_cast<std::size_t>(r) * g.ldy + (t % 2) * 16, g.ldy, add_extra);
    } else if (direct) {
      scale_sums_into(buf[grp & 1][t], rows, scale, sa + r, c0 + static_cast<std::size_t>(r) * ldc + (t % 2) * 16, ldc,
                      g.accumulate || grp > 0, add_extra);
    } else {
      scale_sums_into(buf[grp & 1][t], rows, scale, sa + r, acc[t], 16, grp > 0, add_extra);
    }
  };
  auto flush_group = [&](int grp) { for_each_c_tile<TwoRowTiles, TwoPanels>([&](int t) { flush_one(grp, t); }); };
  DeferredFlush* const deferred = direct ? job.deferred : nullptr;
  const int slot = deferred ? deferred->slot : 0;
  auto& extra_tiles = deferred ? deferred->extra[slot] : extra;
  for (int grp = 0; grp < groups; ++grp) {
    zero_c_tiles<TwoRowTiles, TwoPanels>();
    const int kb_end = std::min(job.kblocks, (grp + 1) * job.group_blocks);
    for (int kb = grp * job.group_blocks; kb < kb_end; ++kb) {
      const std::uint8_t* bk = b0 + static_cast<std::size_t>(kb) * kBlockBytes;
      const std::int8_t* ak = a0 + static_cast<std::size_t>(kb) * a_kstep;
      next.ask(kb);
      if (prefetch) {
        // Past the panel's end this reaches into the next panel or beyond the matrix: a prefetch
        // never faults, and the next pair's first blocks are wanted anyway.
        prefetch_tile_block_l2(bk + kPrefetchBlocks * kBlockBytes);
        if constexpr (TwoPanels) prefetch_tile_block_l2(bk + job.panel_stride + kPrefetchBlocks * kBlockBytes);
      }
      if (ask_l1) {
        prefetch_tile_block_l1(bk + kL1AheadBlocks * kBlockBytes);
        if constexpr (TwoPanels) prefetch_tile_block_l1(bk + job.panel_stride + kL1AheadBlocks * kBlockBytes);
      }
      tile_step<TileProduct::int8, TwoRowTiles, TwoPanels>(ak, a_second, lda_bytes, bk, job.panel_stride);
      if (deferred && deferred->next < deferred->count) deferred->run_one();
      if (unpack != nullptr && kb + 1 < job.kblocks) {
        unpack->block(kb + 1);
        // The tile loads are asm statements the compiler does not see read memory: the next
        // k-step's must come after these stores.
        __asm__ volatile("" ::: "memory");
      }
    }
    if (grp > 0) flush_group(grp - 1);
    auto& b = deferred ? deferred->sums[slot] : buf[grp & 1];
    store_c_tiles<TwoRowTiles, TwoPanels>([&](int t) { return b[t]; }, kTileRowBytes);
    __asm__ volatile("" ::: "memory");
  }
  if (second) {
    const long lda2_bytes = static_cast<long>(g.lda2 * sizeof(bf16));
    const bf16* a2 = g.a2 + static_cast<std::size_t>(row0) * g.lda2;
    const int kblocks2 = g.k2_padded / kBlockK;
    const std::size_t b2_panel = second_panel_stride(g.k2_padded, g.b2_panel_stride);
    const bf16* b2 = g.packed_b2 + static_cast<std::size_t>(panel) * b2_panel;
    zero_c_tiles<TwoRowTiles, TwoPanels>();
    for (int kb = 0; kb < kblocks2; ++kb) {
      const bf16* ak = a2 + static_cast<std::size_t>(kb) * kBlockK;
      const bf16* bk = b2 + static_cast<std::size_t>(kb) * kBlockElements;
      tile_step<TileProduct::bf16, TwoRowTiles, TwoPanels>(ak, kTileRows * lda2_bytes, lda2_bytes, bk, b2_panel * sizeof(bf16));
    }
    store_c_tiles<TwoRowTiles, TwoPanels>([&](int t) { return extra_tiles[t]; }, kTileRowBytes);
    __asm__ volatile("" ::: "memory");
  }
  if (deferred) {
    deferred->run_all();  // what the k-steps did not reach (fewer k-steps than tiles)
    for_each_c_tile<TwoRowTiles, TwoPanels>([&](int t) {
      const int r = t / 2 * kTileRows, p = panel + t % 2;
      deferred->pending[deferred->count++] = {deferred->sums[slot][t],
                                              scales + static_cast<std::size_t>(p) * 16,
                                              sa + r,
                                              c0 + static_cast<std::size_t>(r) * ldc + (t % 2) * 16,
                                              second ? extra_tiles[t] : nullptr,
                                              t < 2 ? rows0 : rows1,
                                              to_y ? y0 + static_cast<std::size_t>(r) * g.ldy + (t % 2) * 16 : nullptr};
    });
    deferred->slot ^= 1;
    return;
  }
  if (groups > 0) flush_group(groups - 1);
  if (direct) return;
  auto write_one = [&](int t) {
    const int r = t / 2 * kTileRows, rows = t < 2 ? rows0 : rows1;
    float* c = c0 + static_cast<std::size_t>(r) * ldc + (t % 2) * 16;
    for (int i = 0; i < rows; ++i) {
      __m512 v = _mm512_load_ps(acc[t] + i * 16);
      if (g.accumulate) v = _mm512_add_ps(v, _mm512_loadu_ps(c + i * ldc));
      _mm512_storeu_ps(c + i * ldc, v);
    }
  };
  for_each_c_tile<TwoRowTiles, TwoPanels>(write_one);
}

// Row blocks outside, panel pairs inside, as in gemm_bf16_amx.cpp: on the device (4096 tokens, the
// same process taking turns) the gate_up phase went from 37.8 / 34.6 to 34.2 / 34.4 ms for int8
// and from 41.5 / 45.1 to 35.8 / 35.1 for int4. int4's pairs are unpacked by the first pass's
// first row block (PairUnpack), not all before it.
template <bool TwoRowTiles>
void panel_pairs(const Job& job, int row_begin, int row_end, int rows0, int rows1, int p_begin, int p_end, bool first_pass,
                 const Int4Unpack* int4 = nullptr) {
  for (int row = row_begin; row < row_end; row += kBlockRows) {
    for (int p = p_begin; p < p_end; p += 2) {
      const bool first_row = first_pass && row == row_begin;
      const bool prefetch = first_row && job.g->shape.bits == 8;
      PairUnpack unpack;
      const PairUnpack* unpacking = nullptr;
      if (int4 != nullptr && first_row) {
        unpack = int4->start_pair(p, p + 1 < p_end);
        unpacking = &unpack;
      }
      if (p + 1 < p_end) {
        tile_block<TwoRowTiles, true>(job, row, rows0, rows1, p, prefetch, {}, unpacking);
      } else {
        tile_block<TwoRowTiles, false>(job, row, rows0, rows1, p, prefetch, {}, unpacking);
      }
    }
  }
}

// The job over B as the tiles read it: int8's codes; or int4's panels unpacked into int8 blocks
// (whoever unpacks them sets b and b_panel0), summed over all of K under one scale per column when
// `multiples` (their group scales decompose into column scales), else group by group.
Job make_job(const GemmIntArgs& args, bool multiples) {
  const PackedIntShape& s = args.shape;
  Job job{&args, args.b.codes, 0, s.panel_bytes(), s.kblocks, s.group / kIntBlockK, args.b.scales, s.groups};
  if (s.bits != 4) return job;
  job.panel_stride = static_cast<std::size_t>(s.kblocks) * kBlockBytes;
  if (multiples) {
    job.group_blocks = s.kblocks;
    job.scales = args.b.column_scales;
    job.groups = 1;
  }
  return job;
}

// One row block of pairs_outside: `full` 32 rows at `row` (16/16 tiles), or the m - row tail rows.
struct RowBlock {
  int row;
  bool full;
};

void pair_block(const Job& job, const RowBlock& b, int m, int p, bool two, bool prefetch, const NextPair& next, const PairUnpack* unpack) {
  const int rows = b.full ? kBlockRows : m - b.row;
  if (rows > kTileRows) {
    ensure_tile_config(make_tile_config(kTileRows, rows - kTileRows));
    if (two) return tile_block<true, true>(job, b.row, kTileRows, rows - kTileRows, p, prefetch, next, unpack);
    return tile_block<true, false>(job, b.row, kTileRows, rows - kTileRows, p, prefetch, next, unpack);
  }
  ensure_tile_config(make_tile_config(rows, rows));
  if (two) return tile_block<false, true>(job, b.row, rows, rows, p, prefetch, next, unpack);
  tile_block<false, false>(job, b.row, rows, rows, p, prefetch, next, unpack);
}

// 33-128 rows (int4: up to 128), in pair_order.hpp's order; int4 unpacks each pair as it comes,
// its first k-block before the pair and the others during its first row block (PairUnpack), and
// its last row block sends the next pair's codes (512 bytes a k-block) to L2.
// (int4->out holds one pair.)
void pairs_outside(Job& job, int m, int p_begin, int p_end, Int4Unpack* int4) {
  RowBlock blocks[kPairsOutsideMaxRows / kBlockRows + 1];
  int count = 0;
  for (int row = 0; row < m; row += kBlockRows) blocks[count++] = {row, row + kBlockRows <= m};
  const PackedIntShape* s = int4 ? int4->shape : nullptr;
  PairUnpack unpack;
  auto start_pair = [&](int p) {
    if (int4) {
      int4->p0 = p;
      unpack = int4->start_pair(p, p + 1 < p_end);
      job.b = int4->out;
      job.b_panel0 = p;
    }
    if (p + 2 >= p_end) return NextPair{};
    if (int4)
      return NextPair{int4->codes + static_cast<std::size_t>(p + 2) * s->panel_bytes(), s->panel_bytes(),
                      static_cast<int>(std::min<std::size_t>(kNextPairBlocks, (s->panel_bytes() + kBlockBytes - 1) / kBlockBytes))};
    return NextPair{job.b + static_cast<std::size_t>(p + 2 - job.b_panel0) * job.panel_stride, job.panel_stride,
                    std::min(job.kblocks, kNextPairBlocks)};
  };
  // int8 streams B from memory on a pair's first block; int4's unpacked pair is in cache.
  for_each_pair_block(count, p_begin, p_end, start_pair, [&](int b, int p, bool two, bool first, const NextPair& next) {
    pair_block(job, blocks[b], m, p, two, !int4 && first, next, int4 && first ? &unpack : nullptr);
  });
}

}  // namespace

void gemm_int_amx(const GemmIntArgs& args) {
  if (args.m <= 0 || args.panel_end <= args.panel_begin) return;
  if (!tile_instructions_usable()) fail_tiles_unusable("gemm_int_amx");
  const PackedIntShape& s = args.shape;
  const bool multiples = s.bits == 4 && args.b.column_scales != nullptr && args.b.group_multiples != nullptr;
  const std::uint8_t* const group_multiples = multiples ? args.b.group_multiples : nullptr;  // what int4's unpack multiplies by
  if (s.group % kIntBlockK != 0 && !multiples)
    fail_kernel_argument("gemm_int_amx", "scale groups must be multiples of 64, or decompose into column scales");
  __asm__ volatile("" ::: "memory");

  const std::size_t int8_panel_bytes = static_cast<std::size_t>(s.kblocks) * kBlockBytes;
  const int group = static_cast<int>(std::max<std::size_t>(2, (kGroupBytes / std::max<std::size_t>(int8_panel_bytes, 1)) & ~std::size_t{1}));
  thread_local AlignedVector<std::uint8_t> unpacked;  // B tiles: cache-line aligned
  const int m_full = args.m / kBlockRows * kBlockRows;
  const int tail = args.m - m_full;

  DeferredFlush deferred;
  deferred.ld = args.ldc;
  deferred.ldy = args.ldy;
  deferred.add = args.accumulate;
  // Several scale groups (int4 not in column form) or an accumulated C: C first, then into y.
  const bool y_in_flush = args.y != nullptr && !args.accumulate && make_job(args, multiples).groups == 1;
  auto finish_y = [&] {
    if (args.y && !y_in_flush) write_int_result_bf16(args, convert_to_bf16_avx512);
  };
  if ((s.bits == 4 || args.m > kBlockRows) && args.m <= kPairsOutsideMaxRows) {
    Job job = make_job(args, multiples);
    job.deferred = &deferred;
    Int4Unpack int4{&s, args.b.codes, group_multiples, nullptr, args.panel_begin};
    if (s.bits == 4) {
      grow_to(unpacked, 2 * int8_panel_bytes);
      int4.out = unpacked.data();
    }
    pairs_outside(job, args.m, args.panel_begin, args.panel_end, s.bits == 4 ? &int4 : nullptr);
    deferred.run_all();
    __asm__ volatile("" ::: "memory");
    finish_y();
    return;
  }
  for (int g0 = args.panel_begin; g0 < args.panel_end; g0 += group) {
    const int g1 = std::min(args.panel_end, g0 + group);
    Job job = make_job(args, multiples);
    job.deferred = &deferred;
    Int4Unpack int4{&s, args.b.codes, group_multiples, nullptr, g0};
    if (s.bits == 4) {
      grow_to(unpacked, static_cast<std::size_t>(g1 - g0) * int8_panel_bytes);
      int4.out = unpacked.data();
      job.b = unpacked.data();
      job.b_panel0 = g0;
    }
    const Int4Unpack* unpacking = s.bits == 4 ? &int4 : nullptr;
    if (m_full > 0) {
      ensure_tile_config(make_tile_config(kTileRows, kTileRows));
      panel_pairs<true>(job, 0, m_full, kTileRows, kTileRows, g0, g1, true, unpacking);
    }
    if (tail > kTileRows) {
      ensure_tile_config(make_tile_config(kTileRows, tail - kTileRows));
      panel_pairs<true>(job, m_full, args.m, kTileRows, tail - kTileRows, g0, g1, m_full == 0, unpacking);
    } else if (tail > 0) {
      ensure_tile_config(make_tile_config(tail, tail));
      panel_pairs<false>(job, m_full, args.m, tail, tail, g0, g1, m_full == 0, unpacking);
    }
  }
  deferred.run_all();
  __asm__ volatile("" ::: "memory");
  finish_y();
}

}  // namespace tilemoe::kernels
