#pragma once
// The GEMM over MXFP4 weights (pack_mxfp4.hpp): C (= or +=) A · Wᵀ (+ A2 · W2ᵀ) under
// GemmBf16Args's contract (gemm_bf16.hpp), with packed_b unused and W given as (s, w), g.k_padded
// == s.k_padded. W is dequantized a chunk of panels at a time into a thread-local bf16 buffer and
// multiplied there by `gemm`, the table's bf16 kernel: every ISA's bf16 kernel runs on MXFP4, and
// the activations stay bf16 (W4A16), so a layer computes with the checkpoint's own weights.
//
// Rows in tile order or 16 and more: a pair of panels over all of K at a time (at K = 2880 that is
// 180 KiB, in L2), the unit the AMX kernel reads per pass, every row multiplied by a pair before
// the next is dequantized. Fewer rows by rows (decode): 4 panels x 8 k-blocks at a time (32 KiB,
// in L1), C accumulated over K's chunks, the second product with the first chunk.
#include "amx/gemm_bf16.hpp"
#include "amx/pack_mxfp4.hpp"

namespace tilemoe::kernels {

// An MXFP4 matrix where a caller passes its weights around (the layer's per expert and projection).
struct Mxfp4Operand {
  PackedMxfp4Shape shape;
  PackedMxfp4View view;
};

inline constexpr int kMxfp4ChunkMaxRows = 15;
inline constexpr int kMxfp4ChunkPanels = 4;
inline constexpr int kMxfp4ChunkKBlocks = 8;

void gemm_mxfp4(const GemmBf16Args& g, const PackedMxfp4Shape& s, const PackedMxfp4View& w, GemmBf16Fn gemm,
                DequantizeMxfp4Fn dequantize);

}  // namespace tilemoe::kernels
