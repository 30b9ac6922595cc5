#pragma once
// How a layer's quantized experts are split over NUMA nodes: each node holds a slice of the
// intermediate dimension (gate and up rows, down columns), so that it computes its share of a
// token's output from its own memory and the nodes' partial outputs add up.
#include <vector>

#include "src/quant/quantize.hpp"

namespace tilemoe::quant {

// Slice boundaries are multiples of this: a multiple of every int4 group (32, 64, 128), so a
// node's down columns hold whole groups and start on a byte boundary of the packed nibbles, and
// of the 64-wide k-block the kernels step through.
inline constexpr int kSliceAlign = 128;

struct IntermediateSlice {
  int begin = 0, end = 0;
  int width() const { return end - begin; }
  bool operator==(const IntermediateSlice&) const = default;
};

// [0, intermediate) in `nodes` consecutive slices with boundaries on multiples of kSliceAlign,
// as even as that allows (the last may be shorter). Throws invalid_argument for nodes < 1 or when
// a node would get nothing (intermediate 176 has two blocks of 128, so at most 2 nodes).
std::vector<IntermediateSlice> numa_slices(int intermediate, int nodes);

// The part of a layer that one node holds, as a layer of intermediate = s.width(): gate/up rows
// and down columns [begin, end); for int4, begin must be a multiple of the group size. int8 down rows keep the scale of their whole row (the nodes'
// partial sums then add up to the unsplit product); int4 down rows keep the scales of their
// groups, which the alignment keeps whole.
QuantizedExperts slice_experts(const QuantizedExperts& q, IntermediateSlice s);

}  // namespace tilemoe::quant
