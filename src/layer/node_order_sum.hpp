#pragma once
// The nodes' partial values of one quantity summed in node order, 0 first: floating-point sums
// depend on their order, so a fixed one gives the same bits for a given node count whatever the
// threads per node. Shared by the cross-node reductions (cross_node_sums.hpp,
// expert_partial_sums.hpp).
#include <algorithm>
#include <cstddef>

namespace tilemoe {

// dst[i] = of(0)[i] + of(1)[i] + ... + of(nodes - 1)[i] for i < n; of(k) is node k's values.
template <typename Of>
void sum_in_node_order(int nodes, Of of, std::size_t n, float* dst) {
  std::copy_n(of(0), n, dst);
  for (int k = 1; k < nodes; ++k) {
    const float* src = of(k);
    for (std::size_t i = 0; i < n; ++i) dst[i] += src[i];
  }
}

}  // namespace tilemoe
