// AVX512-BF16 GEMM: the decode hot path (m = 1..8 rows), where the whole cost is streaming the
// packed weights from memory once. Each 64-byte row of a packed block is one zmm holding 16
// columns × one k-pair; the matching k-pair of an A row is broadcast as one 32-bit value, so a
// single _mm512_dpbf16_ps does 16 columns × 2 k. Up to 4 rows × 4 panels are register-blocked:
// every weight byte loaded feeds up to 4 rows, and 4 panels give 4 independent memory streams
// (and 4 independent accumulator chains at m = 1).
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
// Software prefetch distance along each panel stream, 0 for none. The hardware prefetchers
// already follow the (at most 4) sequential panel streams: on a 16-core AMX Xeon, prefetching
// 1, 2 or 4 k-blocks ahead changed decode bandwidth by less than the run-to-run noise (~15%),
// and on Zen 4 it cost ~25% (16.9 -> 12.9 GB/s, one thread, m = 1).
constexpr int kPrefetchElements = 0;
// Panels are grouped so that one group's weights (both products) stay in L2 while every row group
// of a large m passes over them.
constexpr std::size_t kGroupBytes = 256 * 1024;

inline __m512i broadcast_pair(const bf16* p) {
  std::int32_t v;
  std::memcpy(&v, p, sizeof v);  // A may be only 2-byte aligned
  return _mm512_set1_epi32(v);
}

template <int R, int P>
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
        if constexpr (kPrefetchElements > 0) {
          _mm_prefetch(reinterpret_cast<const char*>(row + kPrefetchElements), _MM_HINT_T0);
        }
        const __m512i w = _mm512_loadu_si512(row);
#pragma GCC unroll 4
        for (int i = 0; i < R; ++i) acc[i][p] = _mm512_dpbf16_ps(acc[i][p], (__m512bh)x[i], (__m512bh)w);
      }
    }
  }
}

// R rows starting at row0 times P panels starting at panel (absolute index).
template <int R, int P>
void block(const GemmBf16Args& g, int row0, int panel) {
  const int kblocks = g.k_padded / kBlockK;
  __m512 acc[R][P];
#pragma GCC unroll 4
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) acc[i][p] = _mm512_setzero_ps();

  const std::size_t stride = static_cast<std::size_t>(kblocks) * kBlockElements;
  accumulate<R, P>(acc, a_rows(g, row0), g.packed_b + panel * stride, stride, kblocks);
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

template <int R>
constexpr BlockFn kBlocksForRows[kMaxPanels] = {block<R, 1>, block<R, 2>, block<R, 3>, block<R, 4>};

constexpr const BlockFn* kBlocks[kMaxRows] = {kBlocksForRows<1>, kBlocksForRows<2>, kBlocksForRows<3>,
                                              kBlocksForRows<4>};

}  // namespace

void gemm_bf16_avx512(const GemmBf16Args& args) {
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
      const BlockFn* fns = kBlocks[std::min(kMaxRows, args.m - row) - 1];
      for (int p = g0; p < g1; p += kMaxPanels) fns[std::min(kMaxPanels, g1 - p) - 1](args, row, p);
    }
  }
}

}  // namespace tilemoe::kernels
