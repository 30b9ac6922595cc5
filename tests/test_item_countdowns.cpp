// Items of one parallel_for that wait for earlier items (src/layer/item_countdowns.hpp): every
// waiting item sees what the items it waited for wrote, on pools of 1 to 16 threads (more threads
// than this machine has cores: the waits must yield), in the order lead_items gives; a failing
// item stops the items waiting for it, and its own exception is the one that comes out.
// Catch's assertions are not thread-safe: items only record what they saw.
#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "catch.hpp"
#include "numa/thread_pool.hpp"
#include "src/layer/item_countdowns.hpp"
#include "src/layer/work_split.hpp"

using namespace tilemoe;

namespace {

// A hang must fail the run, not stall it.
template <class Body>
void within_two_minutes(Body body) {
  auto* done = new std::future<void>(std::async(std::launch::async, std::move(body)));
  if (done->wait_for(std::chrono::seconds(120)) != std::future_status::ready) FAIL("items waited forever");
  std::unique_ptr<std::future<void>> owner(done);
  owner->get();
}

// Experts with random item counts (some with none), prep items for a random subset, in
// lead_items order. Each prep item writes its expert's value after a short spin; every item of an
// expert with prep items waits and then reads the value.
// With guests: a linked sibling pool lends its idle helpers, and a thread outside both joins for
// it (ThreadPool::help_siblings_now) all the while, so that items also run on guests, which take
// them from the same counter: the waits must still end.
int run_case(int threads, std::size_t lead, unsigned seed, bool guests = false) {
  std::mt19937 rng(seed);
  const int experts = 1 + static_cast<int>(rng() % 12);
  std::vector<ExpertItem> items;
  std::vector<std::array<int, 2>> prep;
  for (int e = 0; e < experts; ++e) {
    const int n = static_cast<int>(rng() % 20);
    for (int i = 0; i < n; ++i) items.push_back({e, i, i + 1});
    const int preps = static_cast<int>(rng() % 4);
    for (int p = 0; p < preps; ++p) prep.push_back({e, p});
  }
  const std::vector<std::uint32_t> order = lead_items(prep, items, lead);
  REQUIRE(order.size() == prep.size() + items.size());

  numa::ThreadPool pool(threads, {}), sibling(3, {});
  if (guests) {
    numa::ThreadPool::link_siblings({&pool, &sibling});
    sibling.lend_idle_helpers(true);
  }
  ItemCountdowns ready;
  ready.reset(static_cast<std::size_t>(experts));
  for (const auto& p : prep) ready.expect(static_cast<std::size_t>(p[0]));
  std::vector<int> value(static_cast<std::size_t>(experts), 0);
  std::vector<int> preps_of(static_cast<std::size_t>(experts), 0);
  for (const auto& p : prep) ++preps_of[static_cast<std::size_t>(p[0])];
  std::vector<int> seen(items.size(), -1);
  std::atomic<bool> done{false};
  std::atomic<int> guest_items{0};
  std::thread visitor;
  if (guests)
    visitor = std::thread([&] {
      std::vector<std::uint32_t> exhausted;
      while (!done.load()) sibling.help_siblings_now(exhausted);
    });
  within_two_minutes([&] {
    ready.parallel_for(pool, order.size(), [&](std::size_t slot, int worker) {
      if (worker >= pool.size()) guest_items.fetch_add(1);
      const std::size_t i = order[slot];
      if (i < prep.size()) {
        const int e = prep[i][0];
        volatile int spin = 0;
        while (spin < 20000) spin = spin + 1;
        std::atomic_ref<int>(value[static_cast<std::size_t>(e)]).fetch_add(1, std::memory_order_relaxed);
        ready.count_down(static_cast<std::size_t>(e));
        return;
      }
      const int e = items[i - prep.size()].expert;
      ready.wait(static_cast<std::size_t>(e));
      seen[i - prep.size()] = std::atomic_ref<int>(value[static_cast<std::size_t>(e)]).load(std::memory_order_relaxed);
    }, guests ? numa::ThreadPool::Guests::welcome : numa::ThreadPool::Guests::no);
  });
  done = true;
  if (visitor.joinable()) visitor.join();
  for (std::size_t i = 0; i < items.size(); ++i) CHECK(seen[i] == preps_of[static_cast<std::size_t>(items[i].expert)]);
  if (!guests) CHECK(guest_items == 0);
  return guest_items;  // items run by guests
}

// Where each entry of a lead_items order sits (index into the joint list -> place), after checking
// that the order holds every prep item and item exactly once.
std::vector<int> places_in(const std::vector<std::uint32_t>& order, std::size_t prep_count, std::size_t item_count) {
  REQUIRE(order.size() == prep_count + item_count);
  std::vector<int> pos(order.size(), -1);
  for (std::size_t s = 0; s < order.size(); ++s) {
    REQUIRE(order[s] < order.size());
    CHECK(pos[order[s]] == -1);
    pos[order[s]] = static_cast<int>(s);
  }
  for (std::size_t i = 1; i < item_count; ++i) CHECK(pos[prep_count + i] > pos[prep_count + i - 1]);  // items keep their order
  return pos;
}

// The index of expert e's first item, or -1.
int first_item_of(const std::vector<ExpertItem>& items, int e) {
  for (std::size_t i = 0; i < items.size(); ++i)
    if (items[i].expert == e) return static_cast<int>(i);
  return -1;
}

// How many items come before prep item j.
int items_before(const std::vector<int>& pos, std::size_t prep_count, std::size_t item_count, std::size_t j) {
  int n = 0;
  for (std::size_t i = 0; i < item_count; ++i) n += pos[prep_count + i] < pos[j];
  return n;
}

}  // namespace

TEST_CASE("lead_items puts every prep item ahead of its expert's items, lead items early where it can") {
  std::vector<ExpertItem> items;
  for (int e : {3, 1, 4}) // experts in the order the phase lists them, not sorted
    for (int i = 0; i < 10; ++i) items.push_back({e, i, i + 1});
  const std::vector<std::array<int, 2>> prep = {{3, 0}, {3, 1}, {1, 0}, {4, 2}, {7, 0}};  // expert 7 has no items
  for (std::size_t lead : {0u, 1u, 4u, 15u, 100u}) {
    const std::vector<std::uint32_t> order = lead_items(prep, items, lead);
    const std::vector<int> pos = places_in(order, prep.size(), items.size());
    for (std::size_t j = 1; j < prep.size(); ++j) CHECK(pos[j] > pos[j - 1]);  // prep items keep their order
    for (std::size_t j = 0; j < prep.size(); ++j) {
      const int first = first_item_of(items, prep[j][0]);
      if (first < 0) {
        CHECK(pos[j] > pos[prep.size() + items.size() - 1]);  // at the end
        continue;
      }
      // Items before it: first - lead, or none.
      CHECK(items_before(pos, prep.size(), items.size(), j) == std::max(0, first - static_cast<int>(lead)));
    }
  }
}

TEST_CASE("lead_items with a lead for each prep item places each at its own distance") {
  std::vector<ExpertItem> items;
  for (int e : {2, 0, 5})
    for (int i = 0; i < 12; ++i) items.push_back({e, i, i + 1});
  // Expert 0's first item is 12, expert 5's 24; (e, kind): kind 1 gets the longer lead.
  const std::vector<std::array<int, 2>> prep = {{0, 0}, {0, 1}, {5, 0}, {5, 1}, {5, 1}, {2, 1}, {9, 1}};
  for (std::size_t lead : {0u, 3u, 8u, 20u}) {
    const auto lead_of = [&](std::size_t j) { return prep[j][1] == 1 ? 2 * lead + 1 : lead; };
    const std::vector<std::uint32_t> order = lead_items(prep, items, lead_of);
    const std::vector<int> pos = places_in(order, prep.size(), items.size());
    for (std::size_t j = 0; j < prep.size(); ++j) {
      const int first = first_item_of(items, prep[j][0]);
      const int before = items_before(pos, prep.size(), items.size(), j);
      if (first < 0) {
        CHECK(before == static_cast<int>(items.size()));
        continue;
      }
      CHECK(before == std::max(0, first - static_cast<int>(lead_of(j))));
    }
    // Prep items placed before the same item keep their order (here the two of expert 5, kind 1).
    CHECK(pos[3] < pos[4]);
  }
}

TEST_CASE("items that wait see the writes of the items they waited for, on any pool size") {
  for (int threads : {1, 2, 3, 16})
    for (std::size_t lead : {0u, 1u, 8u})
      for (unsigned seed = 1; seed <= 6; ++seed) run_case(threads, lead, seed * 7919u + static_cast<unsigned>(threads));
}

TEST_CASE("items that wait see the writes of the items they waited for, with guests from a linked pool") {
  int guest_items = 0;
  for (int threads : {1, 2, 3})
    for (std::size_t lead : {0u, 8u})
      for (unsigned seed = 1; seed <= 6; ++seed) guest_items += run_case(threads, lead, seed * 104729u + static_cast<unsigned>(threads), true);
  // Whether a guest gets in before the home pool has run every item is up to the scheduler: on a
  // loaded 2-core machine (CI runs sanitizer builds in parallel) all of the cases above can end
  // first. More cases, until guests have taken items or a minute has passed.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (unsigned seed = 1000; guest_items == 0 && std::chrono::steady_clock::now() < give_up; ++seed)
    guest_items += run_case(1 + static_cast<int>(seed % 3), seed % 2 ? 8u : 0u, seed * 104729u, true);
  CHECK(guest_items > 0);  // the guests did take items
}

TEST_CASE("a failing item stops the items waiting for it, and its exception is the one thrown") {
  for (int threads : {1, 2, 8}) {
    numa::ThreadPool pool(threads, {});
    ItemCountdowns ready;
    std::vector<std::array<int, 2>> prep = {{0, 0}, {1, 0}};
    std::vector<ExpertItem> items;
    for (int e = 0; e < 2; ++e)
      for (int i = 0; i < 40; ++i) items.push_back({e, i, i + 1});
    const std::vector<std::uint32_t> order = lead_items(prep, items, 4);
    for (int run = 0; run < 2; ++run) {  // the object is reusable after a failure
      ready.reset(2);
      ready.expect(0);
      ready.expect(1);
      std::atomic<int> waited_items{0};
      bool threw = false;
      within_two_minutes([&] {
        try {
          ready.parallel_for(pool, order.size(), [&](std::size_t slot, int) {
            const std::size_t i = order[slot];
            if (i == 1) throw std::runtime_error("prep of expert 1 failed");
            if (i == 0) return ready.count_down(0);
            const int e = items[i - prep.size()].expert;
            ready.wait(static_cast<std::size_t>(e));
            ++waited_items;
          });
        } catch (const std::runtime_error& e) {
          threw = std::string(e.what()) == "prep of expert 1 failed";
        }
      });
      CHECK(threw);
      CHECK(waited_items.load() <= 40);  // no item of expert 1 got past its wait
    }
    // And a call without failures runs after it.
    ready.reset(1);
    ready.expect(0);
    std::atomic<int> done{0};
    within_two_minutes([&] {
      ready.parallel_for(pool, 10, [&](std::size_t i, int) {
        if (i == 0) return ready.count_down(0);
        ready.wait(0);
        ++done;
      });
    });
    CHECK(done.load() == 9);
  }
}

TEST_CASE("a wait for an item that comes after the waiting one is a logic_error, on any pool size") {
  // Slot 2 counts counter 0 down; slot 1 waits for it. With one worker that would wait forever;
  // naming the slots makes it an error at once, whatever the pool's size or timing.
  for (int threads : {1, 2, 4}) {
    INFO(threads << " threads");
    numa::ThreadPool pool(threads, {});
    ItemCountdowns ready;
    ready.reset(2);
    ready.expect(0, 2);
    ready.expect(1, 0);
    std::string message;
    within_two_minutes([&] {
      try {
        ready.parallel_for(pool, 3, [&](std::size_t slot, int) {
          if (slot == 0) return ready.count_down(1);
          if (slot == 2) return ready.count_down(0);
          ready.wait(1, slot);  // slot 0 comes first: allowed
          ready.wait(0, slot);
        });
      } catch (const std::logic_error& e) {
        message = e.what();
      }
    });
    CHECK(message.find("slot 1 waits for counter 0") != std::string::npos);
    CHECK(message.find("slot 2 counts down") != std::string::npos);
  }
  // Named in order, the same waits run.
  numa::ThreadPool pool(2, {});
  ItemCountdowns ready;
  ready.reset(1);
  ready.expect(0, 0);
  ready.expect(0, 1);
  std::atomic<int> waited{0};
  within_two_minutes([&] {
    ready.parallel_for(pool, 4, [&](std::size_t slot, int) {
      if (slot < 2) return ready.count_down(0);
      ready.wait(0, slot);
      ++waited;
    });
  });
  CHECK(waited.load() == 2);
}
