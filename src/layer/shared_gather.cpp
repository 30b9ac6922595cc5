#include "src/layer/shared_gather.hpp"

#include <algorithm>
#include <stdexcept>

#include "src/layer/spin_wait.hpp"

namespace tilemoe {

void SharedGather::reset_units(const TokenGroups& groups) {
  const int experts = static_cast<int>(groups.offsets.size()) - 1;
  first_unit_.assign(static_cast<std::size_t>(experts) + 1, 0);
  left_.assign(static_cast<std::size_t>(experts), 0);
  for (int e = 0; e < experts; ++e) {
    const int units = (groups.count(e) + kUnitRows - 1) / kUnitRows;
    left_[static_cast<std::size_t>(e)] = units;
    first_unit_[static_cast<std::size_t>(e) + 1] = first_unit_[static_cast<std::size_t>(e)] + units;
  }
  claimed_.assign(static_cast<std::size_t>(first_unit_.back()), 0);
  a_claimed_.assign(2 * static_cast<std::size_t>(experts), 0);
  a_pending_.assign(2 * static_cast<std::size_t>(experts), 1);
  packed_a_.assign(2 * static_cast<std::size_t>(experts), nullptr);
  xa_claimed_.assign(static_cast<std::size_t>(experts), 0);
  xa_pending_.assign(static_cast<std::size_t>(experts), 1);
  xa_.assign(static_cast<std::size_t>(experts), Projected{});
  error_.reset();
  layout_.store(0, std::memory_order_relaxed);
}

void SharedGather::prepare(const TokenGroups& groups, std::size_t x_ld, std::size_t code_ld, int nodes, int tokens) {
  reset_units(groups);
  nodes_ = std::max(nodes, 1);
  // Padding varies with the routing: grow straight to the most this row count can need (every
  // expert with rows one short of a whole unit), not by what each call needs, which would copy and
  // fault in the buffers again on many calls of a new batch size.
  const std::size_t experts = groups.offsets.size() - 1, total = static_cast<std::size_t>(groups.total());
  const std::size_t padded_rows = total + static_cast<std::size_t>(kUnitRows - 1) * std::min(experts, total);
  // Grown, never shrunk: the same buffers serve every call.
  grow_to(x, padded_rows * x_ld);
  grow_to(codes, padded_rows * code_ld);
  if (code_ld > 0) grow_to(code_scales, total);
  if (code_ld > 0) token_codes.prepare(tokens, code_ld);
}

void SharedGather::prepare_backward(const TokenGroups& groups, std::size_t dy_ld) {
  reset_units(groups);
  nodes_ = 1;
  const std::size_t total = static_cast<std::size_t>(groups.total());
  grow_to(dy, total * dy_ld);
}

bool SharedGather::claim(int e, int row) {
  const std::size_t u = static_cast<std::size_t>(first_unit_[static_cast<std::size_t>(e)] + row / kUnitRows);
  // A load first: every item of an expert asks for its units, most long claimed, and an exchange
  // would take the line from the other cores each time.
  std::atomic_ref<int> flag(claimed_[u]);
  return flag.load(std::memory_order_relaxed) == 0 && flag.exchange(1, std::memory_order_relaxed) == 0;
}

void SharedGather::done(int e) { std::atomic_ref<int>(left_[static_cast<std::size_t>(e)]).fetch_sub(1, std::memory_order_acq_rel); }

void SharedGather::wait(int e) const { wait_for_zero(left_[static_cast<std::size_t>(e)]); }

bool SharedGather::claim_packed_a(int e, int p) {
  return std::atomic_ref<int>(a_claimed_[2 * static_cast<std::size_t>(e) + p]).exchange(1, std::memory_order_relaxed) == 0;
}

void SharedGather::publish_packed_a(int e, int p, const LoraTerm* term) {
  const std::size_t i = 2 * static_cast<std::size_t>(e) + p;
  packed_a_[i] = term;
  std::atomic_ref<int>(a_pending_[i]).store(0, std::memory_order_release);
}

const LoraTerm& SharedGather::wait_packed_a(int e, int p) const {
  const std::size_t i = 2 * static_cast<std::size_t>(e) + p;
  wait_for_zero(a_pending_[i]);
  return *packed_a_[i];
}

bool SharedGather::claim_xa(int e) {
  return std::atomic_ref<int>(xa_claimed_[static_cast<std::size_t>(e)]).exchange(1, std::memory_order_relaxed) == 0;
}

void SharedGather::publish_xa(int e, const Projected& done) {
  xa_[static_cast<std::size_t>(e)] = done;
  std::atomic_ref<int>(xa_pending_[static_cast<std::size_t>(e)]).store(0, std::memory_order_release);
}

const SharedGather::Projected& SharedGather::wait_xa(int e) const {
  wait_for_zero(xa_pending_[static_cast<std::size_t>(e)]);
  return xa_[static_cast<std::size_t>(e)];
}

void SharedGather::wait_for_zero(const int& flag) const {
  spin_until_zero(flag, [this] {
    if (error_.failed()) throw Stopped{};
  });
}

void SharedGather::agree_on_layout(std::uint64_t key) {
  key |= 1;  // 0 means "no node yet"
  std::uint64_t expected = 0;
  if (layout_.compare_exchange_strong(expected, key, std::memory_order_acq_rel) || expected == key) return;
  throw std::logic_error("SharedGather: the nodes of a layer laid out the gathered rows differently");
}

}  // namespace tilemoe
