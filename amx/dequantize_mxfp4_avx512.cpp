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
  walk_mxfp4_blocks(s, w, nb0, nb1, kb0, kb1, out,
                    [&](const std::uint8_t* codes, const std::uint8_t* exponents, bf16* dst) { lookup.block(codes, exponents, dst); });
}

}  // namespace tilemoe::kernels
