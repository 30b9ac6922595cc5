#pragma once
// What the writer and the loader of quantized directories (quantized_file.hpp) must agree on:
// file names, per-file metadata, tensor dtypes and shapes, and quantization.json's text.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "src/io/dtype.hpp"
#include "src/quant/quantized_file.hpp"

namespace tilemoe::quant::format {

std::string layer_file_name(int layer, int node, int nodes);

// The __metadata__ every file of (layer, node) carries.
std::map<std::string, std::string> file_metadata(const QuantizedModelInfo& info, int layer, int node);

// I8 for int8 codes, U8 for int4's packed nibbles.
io::Dtype code_dtype(WeightType type);

// The layer shape within one slice: intermediate = the slice's width.
MoeShape slice_shape(const MoeShape& full, IntermediateSlice s);
// Stored shapes of a projection's tensors, for a layer of shape `s` (a slice's shape for a node).
std::vector<std::int64_t> qweight_shape(WeightType type, const MoeShape& s, Projection p);
std::vector<std::int64_t> scales_shape(WeightType type, int group, const MoeShape& s, Projection p);

// Throws invalid_argument for a type other than int8/int4, an int4 group other than 32/64/128,
// a node count numa_slices refuses, or layers that are empty or not strictly ascending.
void check_spec(const QuantizedModelSpec& spec);

std::string index_text(const QuantizedModelInfo& info);
QuantizedModelInfo parse_index(const std::string& text, const std::string& path);

// What the source hash covers, written next to it in quantization.json.
inline constexpr const char* kHashCovers =
    "FNV-1a 64 of config.json and every safetensors header of the source (file names, tensor names, dtypes, shapes, "
    "offsets, metadata); not of the weight bytes";

}  // namespace tilemoe::quant::format
