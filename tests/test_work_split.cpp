// How a layer's GEMM work is cut into items: every panel of every active expert exactly once, in
// order, in whole units; chunk widths from the expert's row count, the reduction length, the weight
// density and the kernel table's width for experts of few rows.
#include <array>
#include <map>
#include <vector>

#include "catch.hpp"
#include "src/layer/work_split.hpp"
#include "src/routing/token_groups.hpp"

using namespace tilemoe;

namespace {

// Expert e gets rows[e] routed rows (top-1, one token each).
TokenGroups groups_with_rows(const std::vector<int>& rows) {
  std::vector<std::int64_t> ids;
  for (std::size_t e = 0; e < rows.size(); ++e) ids.insert(ids.end(), static_cast<std::size_t>(rows[e]), static_cast<std::int64_t>(e));
  return group_tokens_by_expert(ids.data(), static_cast<int>(ids.size()), 1, static_cast<int>(rows.size()));
}

// Checks that the items tile [0, panels) of every active expert, in order, in whole units.
void check_tiling(const std::vector<ExpertItem>& items, const std::vector<int>& active, int panels, int unit) {
  std::map<int, int> next;  // the panel each expert's next item must start at
  for (int e : active) next[e] = 0;
  for (const ExpertItem& it : items) {
    REQUIRE(next.count(it.expert) == 1);
    CHECK(it.p0 == next[it.expert]);
    CHECK(it.p1 > it.p0);
    CHECK(it.p1 <= panels);
    CHECK(it.p0 % unit == 0);
    if (it.p1 < panels) CHECK((it.p1 - it.p0) % unit == 0);
    next[it.expert] = it.p1;
  }
  for (int e : active) CHECK(next[e] == panels);
}

// The chunk width of each expert's items (all but its last), and a check that they tile [0, panels).
std::map<int, int> widths(const std::vector<ExpertItem>& items, const std::vector<int>& active, int panels, int unit) {
  check_tiling(items, active, panels, unit);
  std::map<int, int> width;
  for (const ExpertItem& it : items) {
    if (it.p1 == panels) continue;
    if (width.count(it.expert) == 0) width[it.expert] = it.p1 - it.p0;
    CHECK(width[it.expert] == it.p1 - it.p0);
  }
  return width;
}

// items == want, as (expert, p0, p1).
void check_items(const std::vector<ExpertItem>& items, const std::vector<std::array<int, 3>>& want) {
  REQUIRE(items.size() == want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    INFO("item " << i);
    CHECK(std::array<int, 3>{items[i].expert, items[i].p0, items[i].p1} == want[i]);
  }
}

}  // namespace

TEST_CASE("work split: items tile every active expert's panels", "[work_split]") {
  const std::vector<int> rows = {1, 0, 3, 15, 16, 40, 63, 64, 200};
  const TokenGroups g = groups_with_rows(rows);
  const std::vector<int> active = {0, 2, 3, 4, 5, 6, 7, 8};
  for (int panels : {1, 5, 88, 89, 128})
    for (int unit : {1, 2})
      for (int few : {1, 4}) {
        INFO("panels " << panels << " unit " << unit << " few_row_panels " << few);
        widths(split_expert_columns(active, g, panels, unit, 0, 1, few), active, panels, unit);
      }
}

TEST_CASE("work split: chunk widths by rows, reduction, density and the few-row width", "[work_split]") {
  const std::vector<int> rows = {1, 3, 4, 15, 16, 63, 64};
  const TokenGroups g = groups_with_rows(rows);
  const std::vector<int> active = {0, 1, 2, 3, 4, 5, 6};
  const int panels = 256;
  // Defaults (k = 2048 or not given): 1 panel under 16 rows, 8 from 16.
  std::map<int, int> w = widths(split_expert_columns(active, g, panels), active, panels, 1);
  CHECK(w == std::map<int, int>{{0, 1}, {1, 1}, {2, 1}, {3, 1}, {4, 8}, {5, 8}, {6, 8}});
  // A kernel that blocks 4 panels widens the experts of 4-15 rows; decode's 1-3 keep 1 panel.
  w = widths(split_expert_columns(active, g, panels, 1, 2048, 1, 4), active, panels, 1);
  CHECK(w == std::map<int, int>{{0, 1}, {1, 1}, {2, 4}, {3, 4}, {4, 8}, {5, 8}, {6, 8}});
  // A short reduction (k = 1408 -> twice) and int8 density (twice) multiply every width.
  w = widths(split_expert_columns(active, g, panels, 1, 1408, 2, 4), active, panels, 1);
  CHECK(w == std::map<int, int>{{0, 4}, {1, 4}, {2, 16}, {3, 16}, {4, 32}, {5, 32}, {6, 32}});
  // int4 density (4) widens every width below 16 rows by 4; from 16 rows, where items are 8 panels,
  // by 2 as int8 (an integer k-block is twice a bf16 one).
  w = widths(split_expert_columns(active, g, panels, 1, 2048, 4, 4), active, panels, 1);
  CHECK(w == std::map<int, int>{{0, 4}, {1, 4}, {2, 16}, {3, 16}, {4, 16}, {5, 16}, {6, 16}});
  w = widths(split_expert_columns(active, g, panels, 1, 1408, 4, 4), active, panels, 1);
  CHECK(w == std::map<int, int>{{0, 8}, {1, 8}, {2, 32}, {3, 32}, {4, 32}, {5, 32}, {6, 32}});
  // Whole units of 2 panels: a width of 1 rounds up to one unit.
  w = widths(split_expert_columns(active, g, panels, 2), active, panels, 2);
  CHECK(w == std::map<int, int>{{0, 2}, {1, 2}, {2, 2}, {3, 2}, {4, 8}, {5, 8}, {6, 8}});
  // A width below 1 is taken as 1.
  w = widths(split_expert_columns(active, g, panels, 1, 0, 1, 0), active, panels, 1);
  CHECK(w.at(2) == 1);
}

TEST_CASE("work split: decode's items widen to decode_panels while the phase keeps 64 items", "[work_split]") {
  const std::vector<int> rows = {1, 3, 4, 16};
  const TokenGroups g = groups_with_rows(rows);
  const std::vector<int> active = {0, 1, 2, 3};
  // 256 panels: 4-panel decode items leave 64 + 64 + 64 + 32 items. Only the 1-3 row experts widen;
  // a width already past decode_panels (int4 density: 4, k = 1408: 8) stays.
  std::map<int, int> w = widths(split_expert_columns(active, g, 256, 1, 2048, 1, 4, 4), active, 256, 1);
  CHECK(w == std::map<int, int>{{0, 4}, {1, 4}, {2, 4}, {3, 8}});
  w = widths(split_expert_columns(active, g, 256, 1, 2048, 2, 4, 4), active, 256, 1);
  CHECK(w == std::map<int, int>{{0, 4}, {1, 4}, {2, 8}, {3, 16}});
  w = widths(split_expert_columns(active, g, 256, 1, 1408, 4, 4, 4), active, 256, 1);
  CHECK(w == std::map<int, int>{{0, 8}, {1, 8}, {2, 32}, {3, 32}});
  // 40 panels: 4 panels would give 10 + 10 + 10 + 5 items, 2 gives 20 + 20 + 10 + 5 = 55, 1 gives
  // 40 + 40 + 10 + 5 = 95: decode keeps 1 panel.
  w = widths(split_expert_columns(active, g, 40, 1, 2048, 1, 4, 4), active, 40, 1);
  CHECK(w == std::map<int, int>{{0, 1}, {1, 1}, {2, 4}, {3, 8}});
  // 100 panels: 4 gives 25 + 25 + 25 + 13 = 88 items.
  w = widths(split_expert_columns(active, g, 100, 1, 2048, 1, 4, 4), active, 100, 1);
  CHECK(w == std::map<int, int>{{0, 4}, {1, 4}, {2, 4}, {3, 8}});
  // 60 panels: 4 gives 15 + 15 + 15 + 8 = 53, 2 gives 30 + 30 + 15 + 8 = 83.
  w = widths(split_expert_columns(active, g, 60, 1, 2048, 1, 4, 4), active, 60, 1);
  CHECK(w == std::map<int, int>{{0, 2}, {1, 2}, {2, 4}, {3, 8}});
  // Whole units: 4 panels in units of 2 stay 4; the default (decode_panels 1) keeps the old widths.
  w = widths(split_expert_columns(active, g, 256, 2, 2048, 1, 4, 4), active, 256, 2);
  CHECK(w.at(0) == 4);
  w = widths(split_expert_columns(active, g, 256, 1, 2048, 1, 4), active, 256, 1);
  CHECK(w.at(0) == 1);
}

TEST_CASE("work split: the last items halved, in order, in whole units", "[work_split]") {
  const std::vector<ExpertItem> items = {{0, 0, 8}, {0, 8, 16}, {1, 0, 8}, {1, 8, 9}, {2, 0, 4}, {2, 4, 8}};
  SECTION("the last count items split, the others as they were") {
    std::vector<ExpertItem> got = items;
    split_last_items(got, 3);
    const std::vector<std::array<int, 3>> want = {{0, 0, 8}, {0, 8, 16}, {1, 0, 8}, {1, 8, 9}, {2, 0, 2}, {2, 2, 4}, {2, 4, 6}, {2, 6, 8}};
    check_items(got, want);
  }
  SECTION("a count over the size splits all; one unit is not split; twice quarters the last") {
    std::vector<ExpertItem> got = items;
    split_last_items(got, 100);
    split_last_items(got, 2);
    const std::vector<std::array<int, 3>> want = {{0, 0, 4}, {0, 4, 8}, {0, 8, 12}, {0, 12, 16}, {1, 0, 4}, {1, 4, 8}, {1, 8, 9},
                                                  {2, 0, 2}, {2, 2, 4}, {2, 4, 5},  {2, 5, 6},   {2, 6, 7}, {2, 7, 8}};
    check_items(got, want);
  }
  SECTION("units of 2 panels stay whole; count 0 changes nothing") {
    std::vector<ExpertItem> got = {{3, 0, 6}, {3, 6, 8}, {3, 8, 9}};
    split_last_items(got, 0);
    CHECK(got.size() == 3);
    split_last_items(got, 3, 2);
    const std::vector<std::array<int, 3>> want = {{3, 0, 2}, {3, 2, 6}, {3, 6, 8}, {3, 8, 9}};
    check_items(got, want);
  }
  SECTION("with the row counts, experts under min_rows keep their items") {
    const TokenGroups g = groups_with_rows({16, 3, 40});
    std::vector<ExpertItem> got = {{0, 0, 8}, {1, 0, 4}, {2, 0, 8}};
    split_last_items(got, 3, 1, &g, 16);
    const std::vector<std::array<int, 3>> want = {{0, 0, 4}, {0, 4, 8}, {1, 0, 4}, {2, 0, 4}, {2, 4, 8}};
    check_items(got, want);
  }
  SECTION("split items of a real split still tile every expert's panels") {
    const std::vector<int> rows = {1, 0, 3, 15, 16, 40, 63, 64, 200};
    const TokenGroups g = groups_with_rows(rows);
    const std::vector<int> active = {0, 2, 3, 4, 5, 6, 7, 8};
    for (int panels : {1, 5, 88, 128}) {
      INFO("panels " << panels);
      std::vector<ExpertItem> got = split_expert_columns(active, g, panels, 1, 1408, 2, 4, 4);
      const std::size_t before = got.size();
      split_last_items(got, 32, 1, &g, 16);
      split_last_items(got, 16);
      CHECK(got.size() >= before);
      check_tiling(got, active, panels, 1);
    }
  }
}
