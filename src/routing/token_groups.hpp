#pragma once
// Routing as the experts see it: for each expert, the (token, slot) pairs it serves, found with
// a counting sort so the order is deterministic (by token, then slot).
#include <cstdint>
#include <vector>

namespace tilemoe {

struct TokenGroups {
  int num_experts = 0;
  std::vector<int> offsets;  // [E + 1]: expert e serves entries [offsets[e], offsets[e + 1])
  std::vector<int> token;    // token index of each entry
  std::vector<int> slot;     // flat routing slot t * k + j of each entry
  std::vector<int> row_of_slot;  // [tokens * k]: the entry of each slot, -1 for ids < 0 (the inverse of slot)

  int count(int e) const { return offsets[e + 1] - offsets[e]; }
  int total() const { return offsets.back(); }
};

// ids < 0 are experts that run elsewhere and are dropped; an id >= num_experts is an
// invalid_argument error naming the token and slot.
TokenGroups group_tokens_by_expert(const std::int64_t* expert_ids, int tokens, int top_k, int num_experts);

}  // namespace tilemoe
