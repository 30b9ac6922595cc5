#include "src/layer/cross_node_sums.hpp"

#include <algorithm>

#include "src/layer/node_order_sum.hpp"
#include "src/layer/spin_wait.hpp"

namespace tilemoe {

void CrossNodeSums::prepare(int nodes) {
  partials_.assign(static_cast<std::size_t>(std::max(nodes, 0)), Partials{});
  unpublished_ = nodes;
  next_block_.store(0, std::memory_order_relaxed);
  error_.reset();
}

void CrossNodeSums::publish(int node, const Partials& p) {
  partials_[static_cast<std::size_t>(node)] = p;
  std::atomic_ref<int>(unpublished_).fetch_sub(1, std::memory_order_acq_rel);
}

void CrossNodeSums::sum_rows(int projection, std::size_t row0, int rows, int rank, float* dst) const {
  spin_until_zero(unpublished_, [this] {
    if (error_.failed()) throw Stopped{};
  });
  const std::size_t r = static_cast<std::size_t>(rank);
  sum_in_node_order(
      static_cast<int>(partials_.size()), [&](int node) { return partials_[static_cast<std::size_t>(node)].of(projection) + row0 * r; },
      static_cast<std::size_t>(rows) * r, dst);
}

}  // namespace tilemoe
