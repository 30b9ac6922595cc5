#pragma once
// A layer whose experts the checkpoint stores as MXFP4 (gpt-oss's *_blocks / *_scales, as the hub
// ships it) read straight into mxfp4 QuantizedExperts: the E2M1 codes copied as stored (their byte
// order is QuantizedProjection's), each E8M0 exponent turned into its power of two. Nothing is
// dequantized and no bf16 copy of the layer is made, so loading gpt-oss-120b in mxfp4 touches
// 1.7 GB a layer instead of 6.4, and the values are the checkpoint's exactly.
#include "src/model/checkpoint.hpp"
#include "src/quant/quantize.hpp"

namespace tilemoe::numa {
class ThreadPool;
}

namespace tilemoe::quant {

// True, with `out` the layer (biases included), when every projection of every expert of `layer`
// is stored as MXFP4 and every group's exponent is one the kernels multiply exactly (a group of
// zeros takes any exponent: its scale becomes 1). False, with `out` unspecified, otherwise: the
// caller reads the bf16 experts and quantizes them (which rounds what cannot be exact). Throws as
// Checkpoint::expert_tensors does for a malformed layer.
bool read_mxfp4_layer(const Checkpoint& ck, int layer, QuantizedExperts& out, numa::ThreadPool* pool = nullptr);

}  // namespace tilemoe::quant
