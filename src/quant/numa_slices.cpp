#include "src/quant/numa_slices.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "tilemoe/error.hpp"

namespace tilemoe::quant {

std::vector<IntermediateSlice> numa_slices(int intermediate, int nodes) {
  if (nodes < 1) fail(ErrorKind::invalid_argument, "NUMA nodes: " + std::to_string(nodes) + " is not a positive count");
  const int blocks = (intermediate + kSliceAlign - 1) / kSliceAlign;
  if (nodes > blocks)
    fail(ErrorKind::invalid_argument, "NUMA nodes: intermediate size " + std::to_string(intermediate) + " has " + std::to_string(blocks) +
                                          " block(s) of " + std::to_string(kSliceAlign) + ", too few for " + std::to_string(nodes) +
                                          " nodes (each node needs at least one)");
  std::vector<IntermediateSlice> out;
  for (int n = 0; n < nodes; ++n) {
    // Node n takes blocks [n * blocks / nodes, (n + 1) * blocks / nodes): counts differ by at most one.
    const int b0 = static_cast<int>(static_cast<long long>(n) * blocks / nodes);
    const int b1 = static_cast<int>(static_cast<long long>(n + 1) * blocks / nodes);
    out.push_back({b0 * kSliceAlign, std::min(intermediate, b1 * kSliceAlign)});
  }
  return out;
}

QuantizedExperts slice_experts(const QuantizedExperts& q, IntermediateSlice s) {
  const MoeShape& full = q.shape;
  // int4 down rows must split on a group boundary (whole groups, whole bytes); int8 anywhere.
  const int align = is_four_bit_weight_type(q.type) ? q.group : 1;
  if (s.begin < 0 || s.end > full.intermediate || s.begin >= s.end || s.begin % align != 0)
    fail(ErrorKind::invalid_argument, "slice [" + std::to_string(s.begin) + ", " + std::to_string(s.end) + ") of intermediate " +
                                          std::to_string(full.intermediate) + " is empty, out of range or not aligned to " +
                                          std::to_string(align));
  QuantizedExperts out;
  out.shape = full;
  out.shape.intermediate = s.width();
  out.type = q.type;
  out.group = q.group;
  if (q.biases.any()) out.biases = q.biases.slice(s.begin, s.end);
  for (Projection p : kProjections) {
    const QuantizedProjection& src = q[p];
    QuantizedProjection& dst = out[p];
    dst = QuantizedProjection::allocate(q.type, full.num_experts, projection_out(out.shape, p), projection_in(out.shape, p), q.group);
    for (int e = 0; e < full.num_experts; ++e) {
      if (p != Projection::down) {  // rows [begin, end): contiguous
        std::memcpy(dst.codes_of(e), src.codes_of(e) + src.row_bytes() * s.begin, dst.expert_code_bytes());
        std::memcpy(dst.scales_of(e), src.scales_of(e) + static_cast<std::size_t>(src.groups_per_row()) * s.begin,
                    dst.expert_scale_count() * sizeof(float));
        continue;
      }
      // Columns [begin, end) of every row. An int4 begin is a multiple of the group, so even: bytes split cleanly.
      const std::size_t byte0 = is_four_bit_weight_type(q.type) ? s.begin / 2 : s.begin;
      const int group0 = is_four_bit_weight_type(q.type) ? s.begin / q.group : 0;
      for (int r = 0; r < dst.n; ++r) {
        std::memcpy(dst.codes_of(e) + dst.row_bytes() * r, src.codes_of(e) + src.row_bytes() * r + byte0, dst.row_bytes());
        std::memcpy(dst.scales_of(e) + static_cast<std::size_t>(dst.groups_per_row()) * r,
                    src.scales_of(e) + static_cast<std::size_t>(src.groups_per_row()) * r + group0, dst.groups_per_row() * sizeof(float));
      }
    }
  }
  return out;
}

}  // namespace tilemoe::quant
