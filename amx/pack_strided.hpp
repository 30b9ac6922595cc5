#pragma once
// Packs a matrix read through strides (a LoRA factor, in either orientation, f32 or bf16) into
// the packed bf16 layout of amx/pack_bf16.hpp, once per layer call. pack_weights_with does the same
// element by element; these do it a row or a block at a time: the per-call LoRA packing of a
// layer (about 250 K elements per expert at DeepSeek-V2-Lite's size, r = 16) is most of the
// LoRA's cost in the forward and backward at a few dozen rows per expert.
#include <vector>

#include "amx/convert_bf16.hpp"
#include "amx/lora_rows.hpp"
#include "amx/pack_bf16.hpp"

namespace tilemoe::kernels {

using ConvertRowFn = void (*)(const float* src, std::size_t n, float scale, bf16* dst);

// W[col][kk] = w(col, kk) for col < n, kk < k into packed (packed_bf16_elements(n, k), every
// element written, padding zero): f32 rounded as float_to_bf16 (the same bits as
// pack_weights_with), bf16 copied bit for bit. `scratch` is reused between calls.
using PackStridedFn = void (*)(StridedFactor w, int n, int k, bf16* packed, std::vector<bf16>& scratch);

// Any strides, through `convert` (a contiguous f32 run to bf16) and a scratch copy.
void pack_strided_with(StridedFactor w, int n, int k, bf16* packed, ConvertRowFn convert, std::vector<bf16>& scratch);
void pack_strided_portable(StridedFactor w, int n, int k, bf16* packed, std::vector<bf16>& scratch);
// Only where isa_available(Isa::avx512_bf16). The two layouts of the LoRA factors (one stride 1)
// go straight to packed blocks in registers (a 16 x 16 transpose of k-pairs, or an interleave of
// two k rows); others take pack_strided_with.
void pack_strided_avx512(StridedFactor w, int n, int k, bf16* packed, std::vector<bf16>& scratch);

}  // namespace tilemoe::kernels
