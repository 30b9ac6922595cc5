// Routing as the experts see it: the counting sort's order, the slot-to-entry map that the
// in-place combine reads, dropped ids < 0, and the error for ids out of range.
#include <vector>

#include "catch.hpp"
#include "src/routing/token_groups.hpp"
#include "tilemoe/error.hpp"

using namespace tilemoe;

TEST_CASE("token groups: entries by expert, then token, and each slot's entry", "[routing]") {
  // 4 tokens, top-2, 3 experts; -1 runs elsewhere.
  const std::vector<std::int64_t> ids = {2, 0, 0, -1, 1, 2, 2, 0};
  const TokenGroups g = group_tokens_by_expert(ids.data(), 4, 2, 3);
  CHECK(g.offsets == std::vector<int>{0, 3, 4, 7});
  CHECK(g.slot == std::vector<int>{1, 2, 7, 4, 0, 5, 6});
  CHECK(g.token == std::vector<int>{0, 1, 3, 2, 0, 2, 3});
  REQUIRE(g.row_of_slot.size() == ids.size());
  CHECK(g.row_of_slot == std::vector<int>{4, 0, 1, -1, 3, 5, 6, 2});
  for (int pos = 0; pos < g.total(); ++pos) CHECK(g.row_of_slot[static_cast<std::size_t>(g.slot[pos])] == pos);
}

TEST_CASE("token groups: an id past the expert count names token and slot", "[routing]") {
  const std::vector<std::int64_t> ids = {0, 1, 3, 0};
  CHECK_THROWS_WITH(group_tokens_by_expert(ids.data(), 2, 2, 3), Catch::Contains("expert_ids[1][0] = 3"));
}
