#pragma once
// quantize_experts into buffers that outlive one layer. A tool quantizing a model layer after
// layer would otherwise have the kernel fault in and zero half a GB of fresh memory per layer
// (V2-Lite int8), which costs more than the quantization itself.
#include "src/quant/quantize.hpp"

namespace tilemoe::quant {

// The codes and scales quantize_experts(w, type, group, pool) gives, written into `out`; its
// buffers are reused when it already holds a layer of this shape, type and group, and
// reallocated otherwise. Throws as quantize_experts does for a bad type or group.
void quantize_experts_into(const ExpertWeightsView& w, WeightType type, int group, numa::ThreadPool* pool, QuantizedExperts& out);

}  // namespace tilemoe::quant
