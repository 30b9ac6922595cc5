#include "src/layer/expert_partial_sums.hpp"

#include <algorithm>
#include <atomic>

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
  const std::size_t c = static_cast<std::size_t>(cols);
  for (int i = 0; i < rows; ++i) {
    float* d = dst + static_cast<std::size_t>(i) * ld_dst;
    std::copy_n(rows_[0] + (row0 + i) * ld_[0], c, d);
    for (std::size_t node = 1; node < rows_.size(); ++node) {
      const float* src = rows_[node] + (row0 + i) * ld_[node];
      for (std::size_t j = 0; j < c; ++j) d[j] += src[j];
    }
  }
}

}  // namespace tilemoe
