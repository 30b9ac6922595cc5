// AVX512-BF16 GEMM: the decode hot path (m = 1..8 rows), where the whole cost is streaming the
// packed weights from memory once. Each 64-byte row of a packed block is one zmm holding 16
// columns × one k-pair; the matching k-pair of an A row is broadcast as one 32-bit value, so a
// single _mm512_dpbf16_ps does 16 columns × 2 k. Up to 4 rows × 4 panels are register-blocked:
// every weight byte loaded feeds up to 4 rows, and 4 panels give 4 independent memory streams
// (and 4 independent accumulator chains at m = 1). gemm_bf16_avx512_prefetching also asks for each
// weight line some lines ahead on the pass that reads the weights from memory.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "amx/gemm_bf16.hpp"
#include "amx/pack_bf16.hpp"

namespace tilemoe::kernels {
namespace {

constexpr int kMaxRows = 4;
static_assert(kATileRows % kMaxRows == 0, "a row group must not cross a row tile of A in tile order");
constexpr int kMaxPanels = 4;
// How far ahead along each panel stream the prefetching entry asks for weights: one k-block, 16
// lines. The hardware prefetchers alone keep too few of a core's 4 streams' lines in flight on an
// Emerald Rapids Xeon (16 cores): there, with the decode items' 4 streams (cases taking turns in one
// process), asking 1 k-block ahead took bf16 at 1 token from 0.862 to 0.801 ms and 16 tokens 6 %
// faster. 0.5 or 2 k-blocks did as well; into L2 instead of L1, a little less. On Zen 4 the same
// prefetch cost 2-13 % (one and two threads, m = 1): the plain entry asks for nothing.
constexpr int kPrefetchBlocks = 1;
// The same lines are also asked for into L2 four k-blocks (4 KiB a stream) ahead. An L1 request
// holds one of the core's 16 fill buffers until its line arrives, which caps a core near 16 lines
// a memory latency (about 7-8 GB/s at 130 ns); decode at 170-200 GB/s over 16 cores needs 11-12,
// and this machine's 2-vCPU guest 16. L2 requests wait in the L2's longer queue instead. On Emerald
// Rapids instances at 8 GB/s a core (session 38) it was 4 % faster on one and no better on another;
// on the 2-vCPU guest (real tiles, 2 threads, base and this build in turn, 6 processes each) 1
// token ran 4-5 % faster in every pair, 16 tokens about 1 %; on a Sapphire Rapids instance at 150-166
// GB/s (builds in turn, 7 processes each) 1 token 1.4 % faster on average, 16 tokens level.
constexpr int kL2AheadBlocks = 4;
// Panels are grouped so that one group's weights (both products) stay in L2 while every row group
// of a large m passes over them.
constexpr std::size_t kGroupBytes = 256 * 1024;

inline __m512i broadcast_pair(const bf16* p) {
  std::int32_t v;
  std::memcpy(&v, p, sizeof v);  // A may be only 2-byte aligned
  return _mm512_set1_epi32(v);
}

template <int R, int P, bool Prefetch = false>
inline void accumulate(__m512 (&acc)[R][P], ARows a, const bf16* panel0, std::size_t panel_stride, int kblocks) {
  for (int kb = 0; kb < kblocks; ++kb) {
    const bf16* block = panel0 + static_cast<std::size_t>(kb) * kBlockElements;
    const bf16* ak = a.p + static_cast<std::size_t>(kb) * a.kblock_stride;
#pragma GCC unroll 16
    for (int r = 0; r < kBlockK / 2; ++r) {
      __m512i x[R];
#pragma GCC unroll 4
      for (int i = 0; i < R; ++i) x[i] = broadcast_pair(ak + i * a.row_stride + 2 * r);
#pragma GCC unroll 4
      for (int p = 0; p < P; ++p) {
        const bf16* row = block + p * panel_stride + r * 32;
        if constexpr (Prefetch) {
          _mm_prefetch(reinterpret_cast<const char*>(row + kPrefetchBlocks * kBlockElements), _MM_HINT_T0);
          _mm_prefetch(reinterpret_cast<const char*>(row + kL2AheadBlocks * kBlockElements), _MM_HINT_T1);
        }
        const __m512i w = _mm512_loadu_si512(row);
#pragma GCC unroll 4
        for (int i = 0; i < R; ++i) acc[i][p] = _mm512_dpbf16_ps(acc[i][p], (__m512bh)x[i], (__m512bh)w);
      }
    }
  }
}

// R rows starting at row0 times P panels starting at panel (absolute index). Prefetch: the main
// product's weights are asked for ahead (a LoRA's B, a few KiB, is not).
template <int R, int P, bool Prefetch>
void block(const GemmBf16Args& g, int row0, int panel) {
  const int kblocks = g.k_padded / kBlockK;
  __m512 acc[R][P];
#pragma GCC unroll 4
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) acc[i][p] = _mm512_setzero_ps();

  const std::size_t stride = static_cast<std::size_t>(kblocks) * kBlockElements;
  accumulate<R, P, Prefetch>(acc, a_rows(g, row0), g.packed_b + panel * stride, stride, kblocks);
  if (g.packed_b2 != nullptr && g.k2_padded > 0) {
    const int kblocks2 = g.k2_padded / kBlockK;
    const std::size_t stride2 = second_panel_stride(g.k2_padded, g.b2_panel_stride);
    accumulate<R, P>(acc, ARows{g.a2 + row0 * g.lda2, g.lda2, kBlockK}, g.packed_b2 + panel * stride2, stride2, kblocks2);
  }

#pragma GCC unroll 4
  for (int i = 0; i < R; ++i) {
    float* ci = g.c + (row0 + i) * g.ldc + (panel - g.panel_begin) * kPanelColumns;
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) {
      __m512 v = acc[i][p];
      if (g.accumulate) v = _mm512_add_ps(v, _mm512_loadu_ps(ci + p * kPanelColumns));
      _mm512_storeu_ps(ci + p * kPanelColumns, v);
    }
  }
}

using BlockFn = void (*)(const GemmBf16Args&, int, int);

template <int R, bool Prefetch>
constexpr BlockFn kBlocksForRows[kMaxPanels] = {block<R, 1, Prefetch>, block<R, 2, Prefetch>, block<R, 3, Prefetch>,
                                                block<R, 4, Prefetch>};

template <bool Prefetch>
constexpr const BlockFn* kBlocks[kMaxRows] = {kBlocksForRows<1, Prefetch>, kBlocksForRows<2, Prefetch>,
                                              kBlocksForRows<3, Prefetch>, kBlocksForRows<4, Prefetch>};

template <bool Prefetch>
void gemm_by_panel_groups(const GemmBf16Args& args) {
  // Sized by the main product's weights, as in the AMX kernel: a LoRA's few k-blocks of B
  // would otherwise make the groups one panel narrower.
  const std::size_t panel_bytes =
      static_cast<std::size_t>(args.k_padded > 0 ? args.k_padded : (args.packed_b2 != nullptr ? args.k2_padded : 0)) *
      kPanelColumns * sizeof(bf16);
  const int group = static_cast<int>(
      std::max<std::size_t>(kMaxPanels, panel_bytes == 0 ? kMaxPanels : kGroupBytes / panel_bytes));
  for (int g0 = args.panel_begin; g0 < args.panel_end; g0 += group) {
    const int g1 = std::min(args.panel_end, g0 + group);
    for (int row = 0; row < args.m; row += kMaxRows) {
      // Only the first row group reads the group's weights from memory; the others find them in L2.
      const int rows = std::min(kMaxRows, args.m - row);
      const BlockFn* fns = row == 0 ? kBlocks<Prefetch>[rows - 1] : kBlocks<false>[rows - 1];
      for (int p = g0; p < g1; p += kMaxPanels) fns[std::min(kMaxPanels, g1 - p) - 1](args, row, p);
    }
  }
}

}  // namespace

void gemm_bf16_avx512(const GemmBf16Args& args) { gemm_by_panel_groups<false>(args); }

void gemm_bf16_avx512_prefetching(const GemmBf16Args& args) { gemm_by_panel_groups<true>(args); }

}  // namespace tilemoe::kernels
