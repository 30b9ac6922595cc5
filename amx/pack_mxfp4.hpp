#pragma once
// MXFP4 weights (the OCP microscaling FP4 format gpt-oss ships its experts in): E2M1 codes, and
// one power-of-two scale (E8M0: 2^(e - 127)) per 32 consecutive inputs of a row. The packed
// layout mirrors the bf16 one (pack_bf16.hpp), one (panel nb, k-block kb) block at a time, so
// that one block dequantizes to exactly one packed bf16 block (1 KiB, one AMX B tile):
//
//   codes:     256 bytes a block, four 64-byte lines; the 16-bit word w = c*2 + p of line j
//              (j: 0..3, little-endian bytes 2w, 2w + 1) holds element (4j + t, c, p) in its
//              nibble t (bits 4t..4t + 3, t: 0..3), where element (r, c, p) is
//              Q[nb*16 + c][kb*32 + 2r + p] (r: k-pair, c: column, p: 0..1), as in pack_bf16;
//   exponents: 16 bytes a block; byte c is the E8M0 exponent of row nb*16 + c's inputs
//              kb*32 .. kb*32 + 31 (one MXFP4 group is one k-block).
//
// So one line shifted right by 4t and looked up (VPERMW, which reads only an index word's low 5
// bits, against a 32-entry table that repeats the 16 values) is one row of the bf16 block: four
// rows a line, with no widening of bytes to words (a shuffle each) in between.
//
// Both arrays hold the blocks panel by panel, a panel's k-blocks contiguous, so a panel streams
// in order along K. Padding rows and inputs have code 0 (+0) and exponent 127 (scale 1).
//
// Every value of a group whose exponent lies in [kMxfp4MinExponent, kMxfp4MaxExponent] is a
// normal bf16 number, so the dequantized weights are exact: the kernels compute with the very
// weights the checkpoint holds (quant/quantize.hpp keeps exponents in that range).
#include <cstddef>
#include <cstdint>

#include "amx/pack_bf16.hpp"
#include "tilemoe/bf16.hpp"
#include "tilemoe/mxfp4.hpp"

namespace tilemoe::kernels {

static_assert(kMxfp4Group == kBlockK, "one MXFP4 group is one k-block");
inline constexpr std::size_t kMxfp4BlockCodeBytes = 256;
inline constexpr std::size_t kMxfp4BlockExponentBytes = kPanelColumns;
inline constexpr int kMxfp4MinExponent = 2;    // 0.5 * 2^(2 - 127) = 2^-126, bf16's least normal
inline constexpr int kMxfp4MaxExponent = 252;  // 6 * 2^(252 - 127) = 1.5 * 2^127 < bf16's largest

// The bf16 layout's padding and block counts, with the sizes of the two arrays.
struct PackedMxfp4Shape : PackedShape {
  std::size_t blocks() const { return static_cast<std::size_t>(panels) * kblocks; }
  std::size_t code_bytes() const { return blocks() * kMxfp4BlockCodeBytes; }
  std::size_t exponent_bytes() const { return blocks() * kMxfp4BlockExponentBytes; }
};

// The bf16 layout's padding (pack_bf16.hpp); throws Error(invalid_argument) for negative sizes.
PackedMxfp4Shape packed_mxfp4_shape(int n, int k);

// One packed matrix: where the kernels read it.
struct PackedMxfp4View {
  const std::uint8_t* codes = nullptr;      // code_bytes()
  const std::uint8_t* exponents = nullptr;  // exponent_bytes()
};

// Packs Q [n][k] (E2M1 nibbles, even k in the low nibble, (k + 1) / 2 bytes a row at stride ldq)
// with its exponents [n][ceil(k / 32)] (row stride lde) into `codes` and `exponents`, which must
// hold code_bytes() and exponent_bytes(); every byte of them is written.
void pack_mxfp4_weights(const PackedMxfp4Shape& s, const std::uint8_t* q, std::size_t ldq, const std::uint8_t* e,
                        std::size_t lde, std::uint8_t* codes, std::uint8_t* exponents);

// Where element (r, c, p) of a block lies in its 256 code bytes: the byte, and the shift of its
// nibble within it.
inline constexpr std::size_t mxfp4_code_byte(int r, int c, int p) {
  return static_cast<std::size_t>(r / 4) * 64 + static_cast<std::size_t>(c * 2 + p) * 2 + static_cast<std::size_t>((r % 4) / 2);
}
inline constexpr int mxfp4_code_shift(int r) { return (r % 2) * 4; }
inline int mxfp4_block_code(const std::uint8_t* block_codes, int r, int c, int p) {
  return (block_codes[mxfp4_code_byte(r, c, p)] >> mxfp4_code_shift(r)) & 0x0f;
}

// The E2M1 code (0..15) and exponent of packed element (col, kk); for tests and references.
int packed_mxfp4_code(const PackedMxfp4Shape& s, const std::uint8_t* codes, int col, int kk);
int packed_mxfp4_exponent(const PackedMxfp4Shape& s, const std::uint8_t* exponents, int col, int kk);

// The k-blocks [kb0, kb1) of panels [nb0, nb1), dequantized into the packed bf16 layout of a
// matrix with kb1 - kb0 k-blocks a panel: out[((q*(kb1 - kb0) + j)*16 + r)*32 + c*2 + p] is
// element (r, c, p) of block (nb0 + q, kb0 + j). Exact for exponents in
// [kMxfp4MinExponent, kMxfp4MaxExponent] (and any exponent of a group whose codes are all ±0);
// unspecified, but never a trap, for others. Pure: no allocation, no threads.
using DequantizeMxfp4Fn = void (*)(const PackedMxfp4Shape& s, const PackedMxfp4View& w, int nb0, int nb1, int kb0, int kb1,
                                   bf16* out);
void dequantize_mxfp4_blocks_portable(const PackedMxfp4Shape& s, const PackedMxfp4View& w, int nb0, int nb1, int kb0, int kb1,
                                      bf16* out);
// Only where isa_available(Isa::avx2). The same bits as the portable one.
void dequantize_mxfp4_blocks_avx2(const PackedMxfp4Shape& s, const PackedMxfp4View& w, int nb0, int nb1, int kb0, int kb1,
                                  bf16* out);
// Only where isa_available(Isa::avx512_bf16) (it needs AVX512-BW). The same bits as the portable one.
void dequantize_mxfp4_blocks_avx512(const PackedMxfp4Shape& s, const PackedMxfp4View& w, int nb0, int nb1, int kb0, int kb1,
                                    bf16* out);

// The walk every dequantize_mxfp4_blocks_* takes: dequantize_block(codes, exponents, out) for each
// block, with the block's kMxfp4BlockCodeBytes codes, its 16 columns' exponents and its place in
// the layout above.
template <class DequantizeBlock>
inline void walk_mxfp4_blocks(const PackedMxfp4Shape& s, const PackedMxfp4View& w, int nb0, int nb1, int kb0, int kb1, bf16* out,
                              DequantizeBlock&& dequantize_block) {
  const int kbs = kb1 - kb0;
  for (int nb = nb0; nb < nb1; ++nb) {
    const std::size_t first = static_cast<std::size_t>(nb) * s.kblocks + kb0;
    const std::uint8_t* codes = w.codes + first * kMxfp4BlockCodeBytes;
    const std::uint8_t* exponents = w.exponents + first * kMxfp4BlockExponentBytes;
    bf16* dst = out + static_cast<std::size_t>(nb - nb0) * kbs * kBlockElements;
    for (int b = 0; b < kbs; ++b, codes += kMxfp4BlockCodeBytes, exponents += kMxfp4BlockExponentBytes, dst += kBlockElements)
      dequantize_block(codes, exponents, dst);
  }
}

// E2M1 code times 2^(exponent - 127), rounded to bf16 (exact in the range above).
bf16 mxfp4_value_bf16(int code, int exponent);

}  // namespace tilemoe::kernels
