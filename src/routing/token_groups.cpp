#include "src/routing/token_groups.hpp"

#include <string>

#include "tilemoe/error.hpp"

namespace tilemoe {

TokenGroups group_tokens_by_expert(const std::int64_t* ids, int tokens, int top_k, int num_experts) {
  TokenGroups g;
  g.num_experts = num_experts;
  g.offsets.assign(num_experts + 1, 0);
  std::size_t n = static_cast<std::size_t>(tokens) * top_k;
  for (std::size_t i = 0; i < n; ++i) {
    std::int64_t e = ids[i];
    if (e >= num_experts)
      fail(ErrorKind::invalid_argument, "expert_ids[" + std::to_string(i / top_k) + "][" + std::to_string(i % top_k) + "] = " +
                                            std::to_string(e) + " is out of range: this layer has " + std::to_string(num_experts) +
                                            " experts (ids < 0 mark experts that run elsewhere)");
    if (e >= 0) ++g.offsets[e + 1];
  }
  for (int e = 0; e < num_experts; ++e) g.offsets[e + 1] += g.offsets[e];
  g.token.resize(g.offsets.back());
  g.slot.resize(g.offsets.back());
  g.row_of_slot.assign(n, -1);
  std::vector<int> cursor(g.offsets.begin(), g.offsets.end() - 1);
  for (std::size_t i = 0; i < n; ++i) {
    std::int64_t e = ids[i];
    if (e < 0) continue;
    int pos = cursor[e]++;
    g.token[pos] = static_cast<int>(i / top_k);
    g.slot[pos] = static_cast<int>(i);
    g.row_of_slot[i] = pos;
  }
  return g;
}

}  // namespace tilemoe
