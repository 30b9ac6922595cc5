// Plain C++ for CPUs with neither AVX512-BF16 nor AMX. It keeps the shape of the fast kernels
// (a few rows × one panel held in f32 accumulators, one pass over the panel's k-blocks) so that
// each packed block is read once per row group, and leaves vectorisation to the compiler.
#include <algorithm>

#include "amx/gemm_bf16.hpp"
#include "amx/pack_bf16.hpp"

namespace tilemoe::kernels {
namespace {

constexpr int kRows = 4;
static_assert(kATileRows % kRows == 0, "a row group must not cross a row tile of A in tile order");

template <int R>
void accumulate_panel(float (&acc)[kRows][kPanelColumns], ARows a, const bf16* panel, int kblocks) {
  for (int kb = 0; kb < kblocks; ++kb) {
    const bf16* block = panel + static_cast<std::size_t>(kb) * kBlockElements;
    // A is converted a k-block at a time in contiguous runs: GCC 12's -O3 vectoriser turned
    // per-k-pair reads of R < 4 rows into loads of a fourth row, past the end of A.
    float x[kRows][kBlockK];
    for (int i = 0; i < R; ++i) {
      for (int q = 0; q < kBlockK; ++q) x[i][q] = bf16_to_float(a.p[i * a.row_stride + kb * a.kblock_stride + q]);
    }
    for (int r = 0; r < kBlockK / 2; ++r) {
      float w0[kPanelColumns], w1[kPanelColumns];
      for (int c = 0; c < kPanelColumns; ++c) {
        w0[c] = bf16_to_float(block[r * 32 + 2 * c]);
        w1[c] = bf16_to_float(block[r * 32 + 2 * c + 1]);
      }
      for (int i = 0; i < R; ++i) {
        const float x0 = x[i][2 * r], x1 = x[i][2 * r + 1];
        for (int c = 0; c < kPanelColumns; ++c) acc[i][c] += x0 * w0[c] + x1 * w1[c];
      }
    }
  }
}

template <int R>
void row_group(const GemmBf16Args& g, int row0) {
  const int kblocks = g.k_padded / kBlockK;
  const bool second = g.packed_b2 != nullptr && g.k2_padded > 0;
  const int kblocks2 = second ? g.k2_padded / kBlockK : 0;
  for (int p = g.panel_begin; p < g.panel_end; ++p) {
    float acc[kRows][kPanelColumns] = {};
    accumulate_panel<R>(acc, a_rows(g, row0), g.packed_b + static_cast<std::size_t>(p) * kblocks * kBlockElements, kblocks);
    if (second) {
      accumulate_panel<R>(acc, ARows{g.a2 + row0 * g.lda2, g.lda2, kBlockK},
                          g.packed_b2 + static_cast<std::size_t>(p) * second_panel_stride(g.k2_padded, g.b2_panel_stride), kblocks2);
    }
    for (int i = 0; i < R; ++i) {
      float* ci = g.c + (row0 + i) * g.ldc + (p - g.panel_begin) * kPanelColumns;
      for (int c = 0; c < kPanelColumns; ++c) ci[c] = g.accumulate ? ci[c] + acc[i][c] : acc[i][c];
    }
  }
}

}  // namespace

void gemm_bf16_portable(const GemmBf16Args& args) {
  int row = 0;
  for (; row + kRows <= args.m; row += kRows) row_group<kRows>(args, row);
  switch (args.m - row) {
    case 3: row_group<3>(args, row); break;
    case 2: row_group<2>(args, row); break;
    case 1: row_group<1>(args, row); break;
    default: break;
  }
}

}  // namespace tilemoe::kernels
