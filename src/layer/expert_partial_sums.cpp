#include "src/layer/expert_partial_sums.hpp"

#include <algorithm>
#include <atomic>

#include "src/layer/node_order_sum.hpp"
#include "src/layer/spin_wait.hpp"

namespace tilemoe {

void ExpertPartialSums::prepare(int nodes, int experts) {
  const std::size_t n = static_cast<std::size_t>(std::max(nodes, 0));
  rows_.assign(n, nullptr);
  ld_.assign(n, 0);
  unpublished_.assign(static_cast<std::size_t>(std::max(experts, 0)), nodes);
  error_.reset();
}

void ExpertPartialSums::set_rows(int node, const float* rows, std::size_t ld) {
  rows_[static_cast<std::size_t>(node)] = rows;
  ld_[static_cast<std::size_t>(node)] = ld;
}

void ExpertPartialSums::publish(int e) {
  std::atomic_ref<int>(unpublished_[static_cast<std::size_t>(e)]).fetch_sub(1, std::memory_order_release);
}

void ExpertPartialSums::sum(int e, std::size_t row0, int rows, int cols, float* dst, std::size_t ld_dst) const {
  spin_until_zero(unpublished_[static_cast<std::size_t>(e)], [this] {
    if (error_.failed()) throw Stopped{};
  });
  for (int i = 0; i < rows; ++i) {
    const std::size_t row = row0 + static_cast<std::size_t>(i);
    sum_in_node_order(
        nodes(), [&](int node) { return rows_[static_cast<std::size_t>(node)] + row * ld_[static_cast<std::size_t>(node)]; },
        static_cast<std::size_t>(cols), dst + static_cast<std::size_t>(i) * ld_dst);
  }
}

}  // namespace tilemoe
