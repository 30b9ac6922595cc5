#include "amx/gemm_mxfp4.hpp"

#include <algorithm>

#include "amx/aligned_vector.hpp"
#include "amx/mxfp4_bits.hpp"

namespace tilemoe::kernels {
namespace {

// One worker's dequantized chunk; grown once to the largest chunk it meets.
AlignedVector<bf16>& chunk_buffer(std::size_t elements) {
  thread_local AlignedVector<bf16> buffer;
  grow_to(buffer, std::max<std::size_t>(elements, kBlockElements));
  return buffer;
}

// g's call restricted to W's panels [q0, q1) and k-blocks [kb0, kb1), read from `chunk`.
GemmBf16Args chunk_args(const GemmBf16Args& g, const bf16* chunk, int q0, int q1, int kb0, int kb1) {
  GemmBf16Args c = g;
  c.packed_b = chunk;
  c.panel_begin = 0;
  c.panel_end = q1 - q0;
  c.c = g.c + static_cast<std::size_t>(q0 - g.panel_begin) * kPanelColumns;
  if (g.packed_b2 != nullptr && g.k2_padded > 0)
    c.packed_b2 = g.packed_b2 + static_cast<std::size_t>(q0) * second_panel_stride(g.k2_padded, g.b2_panel_stride);
  if (kb0 > 0 || kb1 < g.k_padded / kBlockK) {
    c.a = g.a + static_cast<std::size_t>(kb0) * kBlockK;
    c.k_padded = (kb1 - kb0) * kBlockK;
  }
  return c;
}

// c's rows from row0 on (row0 a multiple of 16 where A is in tile order).
GemmBf16Args rows_from(const GemmBf16Args& c, int row0) {
  GemmBf16Args r = c;
  r.m = c.m - row0;
  r.a = c.a_tiles ? c.a + static_cast<std::size_t>(row0 / kATileRows) * c.k_padded * kATileRows
                  : c.a + static_cast<std::size_t>(row0) * c.lda;
  if (c.a2 != nullptr) r.a2 = c.a2 + static_cast<std::size_t>(row0) * c.lda2;
  r.c = c.c + static_cast<std::size_t>(row0) * c.ldc;
  return r;
}

// The second product alone, added to C.
void add_second_product(const GemmBf16Args& g, GemmBf16Fn gemm) {
  if (g.packed_b2 == nullptr || g.k2_padded <= 0) return;
  GemmBf16Args second = g;
  second.k_padded = 0;
  second.accumulate = true;
  gemm(second);
}

}  // namespace

void gemm_mxfp4_rows_portable(const GemmBf16Args& g, const PackedMxfp4Shape& s, const PackedMxfp4View& w) {
  for (int nb = g.panel_begin; nb < g.panel_end; ++nb)
    for (int i = 0; i < g.m; ++i) {
      float acc[kPanelColumns] = {};
      for (int kb = 0; kb < s.kblocks; ++kb) {
        const std::size_t block = static_cast<std::size_t>(nb) * s.kblocks + kb;
        const std::uint8_t* codes = w.codes + block * kMxfp4BlockCodeBytes;
        const std::uint8_t* ex = w.exponents + block * kMxfp4BlockExponentBytes;
        const bf16* a = g.a + static_cast<std::size_t>(i) * g.lda + static_cast<std::size_t>(kb) * kBlockK;
        for (int r = 0; r < kBlockK / 2; ++r)
          for (int c = 0; c < kPanelColumns; ++c)
            for (int p = 0; p < 2; ++p) {
              const bf16 v = mxfp4_scaled_bits(mxfp4_block_code(codes, r, c, p), ex[c]);
              acc[c] += bf16_to_float(a[2 * r + p]) * bf16_to_float(v);
            }
      }
      float* c = g.c + static_cast<std::size_t>(i) * g.ldc + static_cast<std::size_t>(nb - g.panel_begin) * kPanelColumns;
      for (int col = 0; col < kPanelColumns; ++col) c[col] = g.accumulate ? c[col] + acc[col] : acc[col];
    }
}

void gemm_mxfp4(const GemmBf16Args& g, const PackedMxfp4Shape& s, const PackedMxfp4View& w, const Mxfp4Kernels& k) {
  const GemmBf16Fn gemm = k.gemm;
  const DequantizeMxfp4Fn dequantize = k.dequantize;
  const int kblocks = s.kblocks;
  const bool rows = k.rows && !g.a_tiles && g.m <= kMxfp4RowsMaxRows;
  if (rows || (k.few_rows && g.m <= kMxfp4FewRowsMaxRows)) {
    (rows ? k.rows : k.few_rows)(g, s, w);
    add_second_product(g, gemm);
    return;
  }
  if (g.a_tiles || g.m > kMxfp4ChunkMaxRows) {
    bf16* buffer = chunk_buffer(2 * static_cast<std::size_t>(kblocks) * kBlockElements).data();
    for (int q0 = g.panel_begin; q0 < g.panel_end; q0 += 2) {
      const int q1 = std::min(q0 + 2, g.panel_end);
      const GemmBf16Args pair = chunk_args(g, buffer, q0, q1, 0, kblocks);
      if (k.pair_first_block == nullptr) {
        dequantize(s, w, q0, q1, 0, kblocks, buffer);
        gemm(pair);
        continue;
      }
      k.pair_first_block(g, s, w, q0, q1, buffer);
      const int first = std::min(g.m, kMxfp4PairFirstBlockRows);
      GemmBf16Args first_rows = pair;
      first_rows.m = first;
      add_second_product(first_rows, gemm);
      if (g.m > first) gemm(rows_from(pair, first));
    }
    return;
  }
  bf16* buffer = chunk_buffer(static_cast<std::size_t>(kMxfp4ChunkPanels) * kMxfp4ChunkKBlocks * kBlockElements).data();
  for (int q0 = g.panel_begin; q0 < g.panel_end; q0 += kMxfp4ChunkPanels) {
    const int q1 = std::min(q0 + kMxfp4ChunkPanels, g.panel_end);
    int kb0 = 0;
    do {
      const int kb1 = std::min(kb0 + kMxfp4ChunkKBlocks, kblocks);
      dequantize(s, w, q0, q1, kb0, kb1, buffer);
      GemmBf16Args c = chunk_args(g, buffer, q0, q1, kb0, kb1);
      if (kb0 > 0) {
        c.accumulate = true;
        c.packed_b2 = nullptr;
        c.k2_padded = 0;
      }
      gemm(c);
      kb0 = kb1;
    } while (kb0 < kblocks);
  }
}

}  // namespace tilemoe::kernels
