#pragma once
// The GEMM over MXFP4 weights (pack_mxfp4.hpp): C (= or +=) A · Wᵀ (+ A2 · W2ᵀ) under
// GemmBf16Args's contract (gemm_bf16.hpp), with packed_b unused and W given as (s, w), g.k_padded
// == s.k_padded. W is dequantized a chunk of panels at a time into a thread-local bf16 buffer and
// multiplied there by `gemm`, the table's bf16 kernel: every ISA's bf16 kernel runs on MXFP4, and
// the activations stay bf16 (W4A16), so a layer computes with the checkpoint's own weights (the
// decode rows kernel may round the activations slightly: GemmMxfp4RowsFn below).
//
// Up to 4 rows by rows (decode): the `rows` kernel, which looks the values up in registers and
// multiplies there, never writing dequantized weights anywhere. Then, where the ISA has one (AMX),
// up to one row tile (16 rows, by rows or in tile order): the `few_rows` kernel, which
// dequantizes each k-step's blocks into L1 while the tiles multiply the previous ones. After
// either, the second product is the bf16 kernel's, added to C. Otherwise, rows in tile order or
// 16 and more: a pair of panels over all of K at a time (at K = 2880 that is 180 KiB, in L2), the
// unit the AMX kernel reads per pass, every row multiplied by a pair before the next is
// dequantized (with `pair_first_block`, the first 32 rows while it is dequantized); 5-15 rows
// by rows: 4 panels x 8 k-blocks at a time (32 KiB, in L1), C accumulated over K's chunks, the
// second product with the first chunk.
#include <cmath>
#include <cstdint>
#include <cstring>

#include "amx/gemm_bf16.hpp"
#include "amx/pack_mxfp4.hpp"

namespace tilemoe::kernels {

// An MXFP4 matrix where a caller passes its weights around (the layer's per expert and projection).
struct Mxfp4Operand {
  PackedMxfp4Shape shape;
  PackedMxfp4View view;
};

inline constexpr int kMxfp4RowsMaxRows = 4;

// 2^(E - 140), E the biased f32 exponent of `largest_magnitude` (finite, >= 0): the step a rows
// kernel may round a k-block of activations to (see GemmMxfp4RowsFn).
inline double mxfp4_rows_step(float largest_magnitude) {
  std::uint32_t bits;
  std::memcpy(&bits, &largest_magnitude, sizeof bits);
  return std::ldexp(1.0, static_cast<int>(bits >> 23) - 140);
}
inline constexpr int kMxfp4ChunkMaxRows = 15;
inline constexpr int kMxfp4FewRowsMaxRows = 16;
inline constexpr int kMxfp4ChunkPanels = 4;
inline constexpr int kMxfp4ChunkKBlocks = 8;

// The main product of g (no second product; g.a by rows, g.m <= kMxfp4RowsMaxRows) over MXFP4
// weights, C = or += per g.accumulate: each block's E2M1 values looked up in registers and
// multiplied there, the block's sums then scaled by its powers of two (the weights are
// mxfp4_bits.hpp's exactly). A kernel may round each k-block of each A row to multiples of
// mxfp4_rows_step of the block's largest magnitude (AVX-512 does: its products are integer ones;
// portable does not), an error of at most 2^-14 of that magnitude per value; values within a
// factor 64 of it stay exact. A block holding an infinity or NaN may make its row's C all NaN.
using GemmMxfp4RowsFn = void (*)(const GemmBf16Args& g, const PackedMxfp4Shape& s, const PackedMxfp4View& w);
void gemm_mxfp4_rows_portable(const GemmBf16Args& g, const PackedMxfp4Shape& s, const PackedMxfp4View& w);
// Only where isa_available(Isa::avx2).
void gemm_mxfp4_rows_avx2(const GemmBf16Args& g, const PackedMxfp4Shape& s, const PackedMxfp4View& w);
// Only where isa_available(Isa::avx512_bf16).
void gemm_mxfp4_rows_avx512(const GemmBf16Args& g, const PackedMxfp4Shape& s, const PackedMxfp4View& w);

// The main product of g (no second product; g.m <= kMxfp4FewRowsMaxRows, A by rows or in tile
// order), C = or += per g.accumulate, with the products of the bf16 tile kernel on the
// dequantized weights (the same sums, k-steps in order). Only where isa_available(Isa::amx_bf16).
using GemmMxfp4FewRowsFn = GemmMxfp4RowsFn;
void gemm_mxfp4_few_rows_amx(const GemmBf16Args& g, const PackedMxfp4Shape& s, const PackedMxfp4View& w);

// Of a product over more rows: the main product of rows [0, min(g.m, kMxfp4PairFirstBlockRows))
// (A by rows or in tile order) over panels [q0, q1) (one or two), C = or += per g.accumulate,
// while the panels' blocks are dequantized into `pair` (q1 - q0 panels of s.kblocks blocks, as
// dequantize(s, w, q0, q1, 0, s.kblocks, pair) writes them), for the other rows' products. The
// products are those of the bf16 tile kernel on the dequantized weights. Only where
// isa_available(Isa::amx_bf16).
inline constexpr int kMxfp4PairFirstBlockRows = 32;
using GemmMxfp4PairFirstBlockFn = void (*)(const GemmBf16Args& g, const PackedMxfp4Shape& s, const PackedMxfp4View& w, int q0, int q1,
                                           bf16* pair);
void gemm_mxfp4_pair_first_block_amx(const GemmBf16Args& g, const PackedMxfp4Shape& s, const PackedMxfp4View& w, int q0, int q1,
                                     bf16* pair);

// An ISA's kernels for gemm_mxfp4 (the kernel table's); few_rows and pair_first_block may be null.
struct Mxfp4Kernels {
  GemmBf16Fn gemm;
  DequantizeMxfp4Fn dequantize;
  GemmMxfp4RowsFn rows;
  GemmMxfp4FewRowsFn few_rows = nullptr;
  GemmMxfp4PairFirstBlockFn pair_first_block = nullptr;
};

void gemm_mxfp4(const GemmBf16Args& g, const PackedMxfp4Shape& s, const PackedMxfp4View& w, const Mxfp4Kernels& k);

}  // namespace tilemoe::kernels
