// MXFP4 blocks to packed bf16 with AVX-512: a code line (four rows of a block, pack_mxfp4.hpp)
// shifted by 0, 4, 8 and 12 bits and looked up (VPERMW) as bf16 bits, each row scaled by adding
// the group's exponent to the bf16 exponent field of its non-zero values (Mxfp4LineLookup::block).
#include "amx/immintrin_gcc12.hpp"

#include <cstdint>

#include "amx/mxfp4_bits.hpp"
#include "amx/mxfp4_lookup_avx512.hpp"
#include "amx/pack_mxfp4.hpp"

namespace tilemoe::kernels {

void dequantize_mxfp4_blocks_avx512(const PackedMxfp4Shape& s, const PackedMxfp4View& w, int nb0, int nb1, int kb0, int kb1,
                                    bf16* out) {
  const Mxfp4LineLookup lookup;
  const int kbs = kb1 - kb0;
  for (int nb = nb0; nb < nb1; ++nb) {
    const std::size_t first = static_cast<std::size_t>(nb) * s.kblocks + kb0;
    const std::uint8_t* src = w.codes + first * kMxfp4BlockCodeBytes;
    const std::uint8_t* ex = w.exponents + first * kMxfp4BlockExponentBytes;
    bf16* dst = out + static_cast<std::size_t>(nb - nb0) * kbs * kBlockElements;
    for (int b = 0; b < kbs; ++b, src += kMxfp4BlockCodeBytes, ex += kMxfp4BlockExponentBytes, dst += kBlockElements)
      lookup.block(src, ex, dst);
  }
}

}  // namespace tilemoe::kernels
