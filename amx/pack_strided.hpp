#pragma once
// Packs an f32 matrix read through strides (a LoRA factor, in either orientation) into the
// packed bf16 layout of amx/pack_bf16.hpp, once per layer call. pack_weights_with does the same
// element by element; this converts whole rows with the ISA's bf16 conversion into a scratch
// copy and then moves 32-bit k-pairs, with no per-element bounds checks: the per-call LoRA
// packing of a layer (about 250 K elements per expert at DeepSeek-V2-Lite's size, r = 16) was
// most of the LoRA's cost in the forward and backward.
#include <vector>

#include "amx/convert_bf16.hpp"
#include "amx/lora_rows.hpp"
#include "amx/pack_bf16.hpp"

namespace tilemoe::kernels {

using ConvertRowFn = void (*)(const float* src, std::size_t n, float scale, bf16* dst);

// W[col][kk] = w.at(col, kk) for col < n, kk < k into packed (packed_bf16_elements(n, k), every
// element written, padding zero). `convert` turns a contiguous f32 run into bf16 (rounding as
// float_to_bf16); `scratch` is reused between calls. The same bits as pack_weights_with.
void pack_strided_f32(StridedF32 w, int n, int k, bf16* packed, ConvertRowFn convert, std::vector<bf16>& scratch);

}  // namespace tilemoe::kernels
