#pragma once
// The cache stack of the fine-tuning forward: each forward_sft that saves for backward fills one
// entry, each backward consumes the newest. Depth > 1 serves gradient checkpointing (forwards
// recomputed before their backward) and several micro-batches in flight. All memory is
// allocated once, at construction, sized by the largest batch and the depth; pushing onto a full
// stack or popping an empty one is an Error(state) that changes nothing (never a silent
// overwrite of an entry a backward still needs).
#include <array>
#include <cstddef>
#include <cstdint>

#include "numa/node_memory.hpp"
#include "src/layer/moe_forward.hpp"
#include "src/lora/lora_view.hpp"
#include "tilemoe/config.hpp"

namespace tilemoe {

struct ForwardCacheEntry {
  int tokens = 0, top_k = 0;  // backward regroups the saved ids, which is cheaper than keeping the groups
  LayerLoraView lora;                   // the LoRA the forward used; backward differentiates at it
  numa::NodeBuffer<bf16> x;             // [max_tokens][hidden], the layer's input
  numa::NodeBuffer<std::int64_t> ids;   // [max_tokens * max_top_k]
  numa::NodeBuffer<float> weights;      // [max_tokens * max_top_k]
  numa::NodeBuffer<bf16> gate, up;      // [max_rows][intermediate], before the activation
  std::array<numa::NodeBuffer<float>, 3> xa;  // [max_rows][max_rank]: s·v·Aᵀ per projection

  // The MoeForward view of this entry's memory for a LoRA set.
  ForwardSave save_target();
};

struct CacheLimits {
  int max_tokens = 0;
  int max_top_k = 0;
  int depth = 1;
  int max_rank = 0;
};

class ForwardCacheStack {
 public:
  ForwardCacheStack() = default;
  // Depth 0 is a layer for inference: every push is an Error(state). Throws invalid_argument for
  // other non-positive limits; std::bad_alloc when the memory is not there.
  ForwardCacheStack(const MoeShape& shape, const CacheLimits& limits, int node = 0);

  int depth() const { return limits_.depth; }
  int size() const { return size_; }
  const CacheLimits& limits() const { return limits_; }
  std::size_t bytes() const { return bytes_; }

  // The entry a push would fill; throws Error(state) when the stack is full. Filling it changes
  // nothing until push().
  ForwardCacheEntry& slot_for_push(const char* who);
  void push();
  // The newest entry; throws Error(state) when the stack is empty.
  const ForwardCacheEntry& top(const char* who) const;
  void pop();

 private:
  CacheLimits limits_;
  std::vector<ForwardCacheEntry> entries_;
  int size_ = 0;
  std::size_t bytes_ = 0;
};

}  // namespace tilemoe
