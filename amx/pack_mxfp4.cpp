#include "amx/pack_mxfp4.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "amx/mxfp4_bits.hpp"

namespace tilemoe::kernels {

PackedMxfp4Shape packed_mxfp4_shape(int n, int k) {
  return PackedMxfp4Shape{packed_shape(n, k)};
}

void pack_mxfp4_weights(const PackedMxfp4Shape& s, const std::uint8_t* q, std::size_t ldq, const std::uint8_t* e,
                        std::size_t lde, std::uint8_t* codes, std::uint8_t* exponents) {
  auto code_of = [&](int row, int kk) -> unsigned {
    if (row >= s.n || kk >= s.k) return 0;
    const std::uint8_t byte = q[static_cast<std::size_t>(row) * ldq + kk / 2];
    return (kk & 1) ? byte >> 4 : byte & 0x0fu;
  };
  for (int nb = 0; nb < s.panels; ++nb)
    for (int kb = 0; kb < s.kblocks; ++kb) {
      const std::size_t block = static_cast<std::size_t>(nb) * s.kblocks + kb;
      std::uint8_t* dst = codes + block * kMxfp4BlockCodeBytes;
      if ((kb + 1) * kBlockK <= s.k) {
        // A whole k-block: source byte r of a row holds the pair r's two inputs (p = 0 low, p = 1
        // high), and pairs 2h and 2h + 1 share each destination byte (their nibbles 0 and 1).
        for (int c = 0; c < kPanelColumns; ++c) {
          const int row = nb * kPanelColumns + c;
          for (int h = 0; h < kBlockK / 4; ++h) {
            std::uint8_t even = 0, odd = 0;
            if (row < s.n) {
              const std::uint8_t* src = q + static_cast<std::size_t>(row) * ldq + static_cast<std::size_t>(kb) * (kBlockK / 2) + 2 * h;
              even = static_cast<std::uint8_t>((src[0] & 0x0f) | (src[1] << 4));
              odd = static_cast<std::uint8_t>((src[0] >> 4) | (src[1] & 0xf0));
            }
            dst[mxfp4_code_byte(2 * h, c, 0)] = even;
            dst[mxfp4_code_byte(2 * h, c, 1)] = odd;
          }
        }
      } else {
        std::fill(dst, dst + kMxfp4BlockCodeBytes, std::uint8_t{0});
        for (int r = 0; r < kBlockK / 2; ++r)
          for (int c = 0; c < kPanelColumns; ++c)
            for (int p = 0; p < 2; ++p)
              dst[mxfp4_code_byte(r, c, p)] |=
                  static_cast<std::uint8_t>(code_of(nb * kPanelColumns + c, kb * kBlockK + 2 * r + p) << mxfp4_code_shift(r));
      }
      std::uint8_t* ex = exponents + block * kMxfp4BlockExponentBytes;
      for (int c = 0; c < kPanelColumns; ++c) {
        const int row = nb * kPanelColumns + c;
        ex[c] = row < s.n ? e[static_cast<std::size_t>(row) * lde + kb] : static_cast<std::uint8_t>(kMxfp4ExponentBias);
      }
    }
}

int packed_mxfp4_code(const PackedMxfp4Shape& s, const std::uint8_t* codes, int col, int kk) {
  const int nb = col / kPanelColumns, c = col % kPanelColumns, kb = kk / kBlockK, r = (kk % kBlockK) / 2, p = kk % 2;
  return mxfp4_block_code(codes + (static_cast<std::size_t>(nb) * s.kblocks + kb) * kMxfp4BlockCodeBytes, r, c, p);
}

int packed_mxfp4_exponent(const PackedMxfp4Shape& s, const std::uint8_t* exponents, int col, int kk) {
  const int nb = col / kPanelColumns, c = col % kPanelColumns, kb = kk / kBlockK;
  return exponents[(static_cast<std::size_t>(nb) * s.kblocks + kb) * kMxfp4BlockExponentBytes + c];
}

bf16 mxfp4_value_bf16(int code, int exponent) {
  return float_to_bf16(std::ldexp(kE2m1Values[code & 15], exponent - kMxfp4ExponentBias));
}

void dequantize_mxfp4_blocks_portable(const PackedMxfp4Shape& s, const PackedMxfp4View& w, int nb0, int nb1, int kb0, int kb1,
                                      bf16* out) {
  walk_mxfp4_blocks(s, w, nb0, nb1, kb0, kb1, out, [](const std::uint8_t* codes, const std::uint8_t* exponents, bf16* dst) {
    for (int r = 0; r < kBlockK / 2; ++r)
      for (int c = 0; c < kPanelColumns; ++c)
        for (int p = 0; p < 2; ++p) dst[r * 32 + c * 2 + p] = mxfp4_scaled_bits(mxfp4_block_code(codes, r, c, p), exponents[c]);
  });
}

}  // namespace tilemoe::kernels
