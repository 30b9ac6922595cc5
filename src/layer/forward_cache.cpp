#include "src/layer/forward_cache.hpp"

#include <string>

#include "tilemoe/error.hpp"

namespace tilemoe {

ForwardSave ForwardCacheEntry::save_target() {
  ForwardSave s;
  s.gate = gate.data();
  s.up = up.data();
  for (int p = 0; p < 3; ++p) s.xa[p] = lora.proj[p].rank > 0 ? xa[p].data() : nullptr;
  return s;
}

ForwardCacheStack::ForwardCacheStack(const MoeShape& shape, const CacheLimits& limits, int node) : limits_(limits) {
  if (limits.max_tokens <= 0 || limits.max_top_k <= 0 || limits.depth < 0 || limits.max_rank < 0)
    fail(ErrorKind::invalid_argument, "forward cache: max_tokens (" + std::to_string(limits.max_tokens) + ") and top_k (" +
                                          std::to_string(limits.max_top_k) + ") must be positive, max_cache_depth (" +
                                          std::to_string(limits.depth) + ") and max_lora_rank (" +
                                          std::to_string(limits.max_rank) + ") non-negative");
  const std::size_t tokens = static_cast<std::size_t>(limits.max_tokens);
  const std::size_t slots = tokens * static_cast<std::size_t>(limits.max_top_k);
  entries_.resize(static_cast<std::size_t>(limits.depth));
  for (auto& e : entries_) {
    e.x = numa::NodeBuffer<bf16>(tokens * shape.hidden, node);
    e.ids = numa::NodeBuffer<std::int64_t>(slots, node);
    e.weights = numa::NodeBuffer<float>(slots, node);
    e.gate = numa::NodeBuffer<bf16>(slots * shape.intermediate, node);
    e.up = numa::NodeBuffer<bf16>(slots * shape.intermediate, node);
    for (auto& xa : e.xa) xa = numa::NodeBuffer<float>(slots * static_cast<std::size_t>(limits.max_rank), node);
    bytes_ += e.x.size() * sizeof(bf16) + slots * (sizeof(std::int64_t) + sizeof(float)) + 2 * e.gate.size() * sizeof(bf16) +
              3 * e.xa[0].size() * sizeof(float);
  }
}

ForwardCacheEntry& ForwardCacheStack::slot_for_push(const char* who) {
  if (limits_.depth == 0)
    fail(ErrorKind::state, std::string(who) + ": this layer saves no forwards (max_cache_depth 0, built for inference): "
                                              "build it with max_cache_depth >= 1 to train");
  if (size_ >= limits_.depth)
    fail(ErrorKind::state, std::string(who) + ": the forward cache stack is full (max_cache_depth " + std::to_string(limits_.depth) +
                               "): run backward for a saved forward first, or build the layer with a deeper cache");
  return entries_[static_cast<std::size_t>(size_)];
}

void ForwardCacheStack::push() { ++size_; }

const ForwardCacheEntry& ForwardCacheStack::top(const char* who) const {
  if (size_ == 0)
    fail(ErrorKind::state, std::string(who) + ": the forward cache stack is empty: backward needs a forward_sft with "
                                              "save_for_backward before it");
  return entries_[static_cast<std::size_t>(size_ - 1)];
}

void ForwardCacheStack::pop() {
  if (size_ > 0) --size_;
}

}  // namespace tilemoe
