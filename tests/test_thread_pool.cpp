// Every test body runs through within(): a pool bug shows up as a hang, and a hang must fail the
// run rather than stall CI. Catch's assertions are not thread-safe, so bodies only collect what
// they saw and the checks happen on the test thread.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <memory>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "catch.hpp"
#include "numa/thread_pool.hpp"
#include "numa/topology.hpp"
#include "tilemoe/error.hpp"

using tilemoe::Error;
using tilemoe::ErrorKind;
using tilemoe::numa::ThreadPool;

namespace {

// Generous: the sanitizer builds on a busy 2-core machine are slow, a hang is forever.
constexpr auto kLimit = std::chrono::seconds(120);

template <class Body>
auto within(Body body) -> decltype(body()) {
  // Leaked if the body hangs: the future's destructor would wait for it forever.
  auto* result = new std::future<decltype(body())>(std::async(std::launch::async, std::move(body)));
  if (result->wait_for(kLimit) != std::future_status::ready) {
    FAIL("the thread pool did not finish within " << kLimit.count() << " s");
  }
  std::unique_ptr<std::future<decltype(body())>> owner(result);
  return owner->get();
}

std::vector<int> two_cpus() {
  std::vector<int> cpus;
  for (const auto& node : tilemoe::numa::system_topology().nodes) {
    cpus.insert(cpus.end(), node.cpus.begin(), node.cpus.end());
  }
  cpus.resize(2, cpus.front());
  return cpus;
}

// Blocks until `arrived` reaches `expected` so that several items provably run at once. Gives up
// after a while instead of hanging; the caller sees that in the result.
bool rendezvous(std::atomic<int>& arrived, int expected) {
  arrived.fetch_add(1);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (arrived.load() < expected) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::yield();
  }
  return true;
}

struct Tally {
  std::vector<int> hits;  // per item
  bool workers_ok = true;  // every worker id in range, and never two calls with one id at once
  std::set<int> workers;   // the worker ids that ran an item
  bool rendezvous_met = true;
};

// A job on `pool` (items `grain` at a time, guests welcome or not) whose first `together` items
// must all run at once: what ran where.
Tally tally(ThreadPool& pool, std::size_t count, std::size_t grain, ThreadPool::Guests guests = ThreadPool::Guests::no,
            int together = 0) {
  std::vector<std::atomic<int>> hits(count), ran_on(count);
  std::vector<std::atomic<int>> busy(static_cast<std::size_t>(pool.worker_slots()));
  std::atomic<bool> ok{true}, met{true};
  std::atomic<int> arrived{0};
  pool.parallel_for(
      count,
      [&](std::size_t item, int worker) {
        if (worker < 0 || worker >= pool.worker_slots()) {
          ok = false;
          return;
        }
        auto& flag = busy[static_cast<std::size_t>(worker)];
        if (flag.exchange(1) != 0) ok = false;
        hits[item].fetch_add(1);
        ran_on[item] = worker;
        if (item < static_cast<std::size_t>(together) && !rendezvous(arrived, together)) met = false;
        flag.store(0);
      },
      grain, guests);
  Tally t;
  t.workers_ok = ok.load();
  t.rendezvous_met = met.load();
  for (std::size_t i = 0; i < count; ++i) {
    t.hits.push_back(hits[i].load());
    t.workers.insert(ran_on[i].load());
  }
  return t;
}

bool each_once(const Tally& t) {
  return std::all_of(t.hits.begin(), t.hits.end(), [](int h) { return h == 1; });
}

}  // namespace

TEST_CASE("every item runs exactly once, on a worker in range", "[thread_pool]") {
  // Grain 0 counts as 1; a grain beyond the count is one chunk.
  for (int threads : {1, 2, 3, 4}) {
    for (std::size_t count : {0, 1, 2, 3, 1000}) {
      for (std::size_t grain : {0, 1, 7, 5000}) {
        CAPTURE(threads, count, grain);
        const Tally t = within([&] {
          ThreadPool pool(threads, two_cpus());
          return tally(pool, count, grain);
        });
        CHECK(t.hits.size() == count);
        CHECK(each_once(t));
        CHECK(t.workers_ok);
      }
    }
  }
}

TEST_CASE("helpers take part: two items can run at the same time", "[thread_pool]") {
  const auto [met, workers] = within([] {
    ThreadPool pool(2, two_cpus());
    std::atomic<int> arrived{0};
    std::atomic<bool> met_all{true};
    std::vector<int> seen(2, -1);
    pool.parallel_for(2, [&](std::size_t item, int worker) {
      seen[item] = worker;
      if (!rendezvous(arrived, 2)) met_all = false;
    });
    return std::make_pair(met_all.load(), std::set<int>(seen.begin(), seen.end()));
  });
  CHECK(met);
  CHECK(workers == std::set<int>{0, 1});
}

TEST_CASE("a pool of one thread runs everything on the caller", "[thread_pool]") {
  const auto [size, all_on_caller] = within([] {
    ThreadPool pool(1, {});
    const auto caller = std::this_thread::get_id();
    std::atomic<bool> ok{true};
    pool.parallel_for(100, [&](std::size_t, int worker) {
      if (worker != 0 || std::this_thread::get_id() != caller) ok = false;
    });
    return std::make_pair(pool.size(), ok.load());
  });
  CHECK(size == 1);
  CHECK(all_on_caller);
}

TEST_CASE("constructor arguments and pinning", "[thread_pool]") {
  // On threads of their own, so the test runner's thread keeps its affinity.
  CHECK(within([] { return tilemoe::numa::pin_current_thread(two_cpus()[0]); }));
  CHECK_FALSE(within([] { return tilemoe::numa::pin_current_thread(-1); }));
  CHECK(within([] { return ThreadPool(0, {3, 1, 2}).size(); }) == 3);
  CHECK(within([] { return ThreadPool(-1, {}).size(); }) == 1);
  CHECK(within([] { return ThreadPool(3, {0}).size(); }) == 3);
  try {
    ThreadPool pool(4097, {});
    FAIL("4097 threads were accepted");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::invalid_argument);
  }
  // A cpu that does not exist is a warning on stderr, not an error.
  const Tally t = within([] {
    ThreadPool pool(2, {0, 1 << 20});
    return tally(pool, 100, 1);
  });
  CHECK(each_once(t));
}

TEST_CASE("an exception in fn reaches the caller and the pool stays usable", "[thread_pool]") {
  const auto [message, no_item_twice, after] = within([] {
    ThreadPool pool(2, two_cpus());
    std::vector<std::atomic<int>> hits(1000);
    std::string what;
    try {
      pool.parallel_for(1000, [&](std::size_t item, int) {
        hits[item].fetch_add(1);
        if (item == 500) throw std::runtime_error("item 500 failed");
      });
    } catch (const std::runtime_error& e) {
      what = e.what();
    }
    const bool once = std::all_of(hits.begin(), hits.end(), [](auto& h) { return h.load() <= 1; });
    return std::make_tuple(what, once, tally(pool, 1000, 3));
  });
  CHECK(message == "item 500 failed");
  CHECK(no_item_twice);
  CHECK(each_once(after));
}

TEST_CASE("an exception thrown on a helper thread keeps its type", "[thread_pool]") {
  const auto [kind, met, after] = within([] {
    ThreadPool pool(2, two_cpus());
    std::atomic<int> arrived{0};
    std::atomic<bool> met_all{true};
    ErrorKind got = ErrorKind::state;
    try {
      pool.parallel_for(2, [&](std::size_t, int worker) {
        if (!rendezvous(arrived, 2)) met_all = false;
        if (worker != 0) tilemoe::fail(ErrorKind::bad_file, "thrown by a helper");
      });
    } catch (const Error& e) {
      got = e.kind();
    }
    return std::make_tuple(got, met_all.load(), tally(pool, 50, 1));
  });
  CHECK(met);
  CHECK(kind == ErrorKind::bad_file);
  CHECK(each_once(after));
}

TEST_CASE("parallel_for from inside fn throws a state error", "[thread_pool]") {
  SECTION("same pool, caught inside fn") {
    const auto [kinds, outer_done] = within([] {
      ThreadPool pool(2, two_cpus());
      std::vector<int> got(10, -1);
      pool.parallel_for(10, [&](std::size_t item, int) {
        try {
          pool.parallel_for(4, [](std::size_t, int) {});
        } catch (const Error& e) {
          got[item] = static_cast<int>(e.kind());
        }
      });
      return std::make_pair(got, tally(pool, 10, 1));
    });
    for (int k : kinds) CHECK(k == static_cast<int>(ErrorKind::state));
    CHECK(each_once(outer_done));
  }
  SECTION("same pool, left to propagate") {
    const int kind = within([] {
      ThreadPool pool(2, two_cpus());
      try {
        pool.parallel_for(10, [&](std::size_t, int) { pool.parallel_for(1, [](std::size_t, int) {}); });
      } catch (const Error& e) {
        return static_cast<int>(e.kind());
      }
      return -1;
    });
    CHECK(kind == static_cast<int>(ErrorKind::state));
  }
  SECTION("back into the same pool through another pool") {
    const auto [inner_ok, cycle_kind] = within([] {
      ThreadPool outer(2, two_cpus());
      ThreadPool inner(2, two_cpus());
      std::atomic<int> inner_items{0};
      int kind = -1;
      // Another pool from inside fn is allowed.
      outer.parallel_for(1, [&](std::size_t, int) {
        inner.parallel_for(8, [&](std::size_t, int) { inner_items.fetch_add(1); });
      });
      try {
        outer.parallel_for(2, [&](std::size_t, int) {
          inner.parallel_for(2, [&](std::size_t, int) { outer.parallel_for(1, [](std::size_t, int) {}); });
        });
      } catch (const Error& e) {
        kind = static_cast<int>(e.kind());
      }
      return std::make_pair(inner_items.load() == 8, kind);
    });
    CHECK(inner_ok);
    CHECK(cycle_kind == static_cast<int>(ErrorKind::state));
  }
}

TEST_CASE("1000 consecutive small calls lose no wake-up", "[thread_pool]") {
  // Pauses around the spin time push the helpers back and forth between spinning and sleeping,
  // which is where a lost wake-up would hide.
  // 4 threads on this 2-core machine: helpers get descheduled mid-job and join jobs late.
  const int threads = GENERATE(2, 4);
  CAPTURE(threads);
  const auto [all_once, workers_ok] = within([threads] {
    ThreadPool pool(threads, two_cpus());
    std::mt19937 rng(12345);
    std::uniform_int_distribution<int> pause_us(0, 250);
    bool once = true;
    bool ok = true;
    for (int call = 0; call < 1000; ++call) {
      const Tally t = tally(pool, 1 + static_cast<std::size_t>(call % 4), 1);
      once = once && each_once(t);
      ok = ok && t.workers_ok;
      if (call % 3 == 0) std::this_thread::sleep_for(std::chrono::microseconds(pause_us(rng)));
    }
    return std::make_pair(once, ok);
  });
  CHECK(all_once);
  CHECK(workers_ok);
}

TEST_CASE("the caller sleeps and is woken when a helper runs long", "[thread_pool]") {
  const bool once = within([] {
    ThreadPool pool(2, two_cpus());
    bool ok = true;
    for (int call = 0; call < 20; ++call) {
      std::vector<std::atomic<int>> hits(2);
      std::atomic<int> arrived{0};
      pool.parallel_for(2, [&](std::size_t item, int worker) {
        rendezvous(arrived, 2);
        if (worker != 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        hits[item].fetch_add(1);
      });
      ok = ok && hits[0].load() == 1 && hits[1].load() == 1;
    }
    return ok;
  });
  CHECK(once);
}

TEST_CASE("a parked pool's helpers sleep and still take part in the next job", "[thread_pool]") {
  // Parked right after a job (helpers still on their way out of it), or once they have been idle
  // a while, or twice: every next job needs every worker (a rendezvous), so a helper left asleep
  // fails it.
  const int threads = GENERATE(2, 4);
  CAPTURE(threads);
  const bool met = within([threads] {
    ThreadPool pool(threads, two_cpus());
    bool ok = true;
    for (int call = 0; call < 60; ++call) {
      std::atomic<int> arrived{0};
      std::atomic<bool> met_all{true};
      pool.parallel_for(static_cast<std::size_t>(threads), [&](std::size_t, int) {
        if (!rendezvous(arrived, threads)) met_all = false;
      });
      ok = ok && met_all.load();
      pool.park();
      if (call % 3 == 1) std::this_thread::sleep_for(std::chrono::microseconds(300));
      if (call % 3 == 2) pool.park();
    }
    return ok;
  });
  CHECK(met);
}

TEST_CASE("two threads calling one pool at once are serialised", "[thread_pool]") {
  const auto [once, workers_ok] = within([] {
    ThreadPool pool(2, two_cpus());
    std::atomic<bool> all_once{true};
    std::atomic<bool> ok{true};
    auto caller = [&] {
      for (int call = 0; call < 300; ++call) {
        const Tally t = tally(pool, 64, 1 + static_cast<std::size_t>(call % 3));
        if (!each_once(t)) all_once = false;
        if (!t.workers_ok) ok = false;
      }
    };
    std::thread a(caller);
    std::thread b(caller);
    a.join();
    b.join();
    return std::make_pair(all_once.load(), ok.load());
  });
  CHECK(once);
  CHECK(workers_ok);
}

namespace {

// Opens small jobs on `pool` from another thread until stopped, so that its helpers keep coming
// back to poll (idle helpers sleep after the spin time, and sleeping ones join nothing).
class KeepPolling {
 public:
  explicit KeepPolling(ThreadPool& pool)
      : thread_([this, &pool] {
          while (!stop_.load()) {
            pool.parallel_for(2, [](std::size_t, int) {});
            std::this_thread::sleep_for(std::chrono::microseconds(20));
          }
        }) {}
  ~KeepPolling() {
    stop_ = true;
    thread_.join();
  }

 private:
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace

TEST_CASE("linked pools: idle helpers join a sibling's welcoming job, with worker numbers of their own", "[thread_pool]") {
  const Tally g = within([] {
    ThreadPool home(3, two_cpus()), busy(2, two_cpus());
    ThreadPool::link_siblings({&home, &busy});
    // busy's guests are home's two helpers and the thread that drives home; home's, busy's two.
    const bool slots = busy.worker_slots() == 5 && home.worker_slots() == 5;
    home.lend_idle_helpers(true);
    KeepPolling polling(home);
    // Four items at once need both of busy's workers and both guests.
    Tally t = tally(busy, 200, 1, ThreadPool::Guests::welcome, 4);
    if (!slots) t.workers_ok = false;
    return t;
  });
  CHECK(g.rendezvous_met);
  CHECK(g.workers_ok);
  CHECK(each_once(g));
  CHECK(*g.workers.rbegin() >= 2);  // a guest ran an item
}

TEST_CASE("linked pools: no guests in a job without Guests::welcome, nor from a pool that does not lend", "[thread_pool]") {
  for (const bool lend : {true, false}) {
    CAPTURE(lend);
    const Tally g = within([lend] {
      ThreadPool home(3, two_cpus()), busy(2, two_cpus());
      ThreadPool::link_siblings({&home, &busy});
      home.lend_idle_helpers(lend);
      KeepPolling polling(home);
      Tally t;
      // Items that wait for each other, so that guests would have had every chance.
      for (int call = 0; call < 20; ++call) {
        const Tally one = tally(busy, 20, 1, lend ? ThreadPool::Guests::no : ThreadPool::Guests::welcome, 2);
        t.workers_ok = t.workers_ok && one.workers_ok && each_once(one);
        t.workers.insert(one.workers.begin(), one.workers.end());
      }
      return t;
    });
    CHECK(g.workers_ok);
    CHECK(*g.workers.rbegin() < 2);
  }
}

// `busy` runs 2000 items of 2 ms (4 s for its own two workers) on a thread of its own, welcoming
// guests, and counts the items they run.
class SlowWelcomingJob {
 public:
  explicit SlowWelcomingJob(ThreadPool& busy)
      : hits_(2000), thread_([this, &busy] {
          busy.parallel_for(
              hits_.size(),
              [&](std::size_t item, int worker) {
                if (worker >= busy.worker_slots()) in_range_ = false;
                if (worker >= busy.size()) guest_items_.fetch_add(1);
                hits_[item].fetch_add(1);
                std::this_thread::sleep_for(std::chrono::milliseconds(2));
              },
              1, ThreadPool::Guests::welcome);
          done_ = true;
        }) {}
  ~SlowWelcomingJob() {
    if (thread_.joinable()) thread_.join();
  }

  // Until a helper of `home` has been a guest here: small jobs on home keep its helpers polling.
  void await_guest(ThreadPool& home) {
    while (guest_items_.load() == 0 && !done_.load()) {
      home.parallel_for(2, [](std::size_t, int) {});
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
  bool done() const { return done_.load(); }
  int guest_items() const { return guest_items_.load(); }
  // After the job's end: every item ran once, on a worker number in range.
  bool finish() {
    thread_.join();
    return in_range_.load() && std::all_of(hits_.begin(), hits_.end(), [](const std::atomic<int>& h) { return h.load() == 1; });
  }

 private:
  std::vector<std::atomic<int>> hits_;
  std::atomic<int> guest_items_{0};
  std::atomic<bool> in_range_{true}, done_{false};
  std::thread thread_;  // last: it starts once the members above exist
};

TEST_CASE("linked pools: a guest goes back to its own pool when that opens a job", "[thread_pool]") {
  const auto [home_met, busy_still_running, busy_ok] = within([] {
    ThreadPool home(3, two_cpus()), busy(2, two_cpus());
    ThreadPool::link_siblings({&home, &busy});
    home.lend_idle_helpers(true);
    SlowWelcomingJob job(busy);
    // Once a helper of home's has been a guest in busy's job (without home's small jobs, both
    // join and stay), a job of home's that needs all three of its workers at once.
    job.await_guest(home);
    std::atomic<int> arrived{0};
    std::atomic<bool> met{true};
    home.parallel_for(3, [&](std::size_t, int) {
      if (!rendezvous(arrived, 3)) met = false;
    });
    const bool still = !job.done();
    return std::make_tuple(met.load(), still, job.finish());
  });
  CHECK(home_met);
  CHECK(busy_still_running);  // home's job did not wait for busy's to end
  CHECK(busy_ok);
}

TEST_CASE("linked pools: a pool that stops lending gets its helpers back after their item", "[thread_pool]") {
  const auto [joined, after_stop, busy_ok] = within([] {
    ThreadPool home(3, two_cpus()), busy(2, two_cpus());
    ThreadPool::link_siblings({&home, &busy});
    home.lend_idle_helpers(true);
    SlowWelcomingJob job(busy);
    job.await_guest(home);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));  // both helpers join and stay
    home.lend_idle_helpers(false);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // items in flight end (2 ms)
    const int before = job.guest_items();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const int after = job.guest_items() - before;
    const bool still = !job.done();
    return std::make_tuple(before > 0 && still, after, job.finish());
  });
  CHECK(joined);
  CHECK(after_stop == 0);
  CHECK(busy_ok);
}

TEST_CASE("linked pools: a thread outside both joins a sibling's job for its pool while that lends", "[thread_pool]") {
  const auto [lent_ran, lent_ok, unlent_ran, idle_ran] = within([] {
    ThreadPool home(2, two_cpus()), busy(2, two_cpus());
    ThreadPool::link_siblings({&home, &busy});
    auto run_busy_with_visitor = [&](bool lend, bool& visitor_ran, bool& ok) {
      home.lend_idle_helpers(lend);
      std::atomic<bool> started{false};
      std::atomic<int> guest_worker{-1};
      std::thread visitor([&] {
        while (!started.load()) std::this_thread::yield();
        std::vector<std::uint32_t> exhausted;
        visitor_ran = home.help_siblings_now(exhausted);
      });
      std::vector<std::atomic<int>> hits(200);
      busy.parallel_for(
          200,
          [&](std::size_t item, int worker) {
            started = true;
            if (worker >= busy.size()) guest_worker = worker;
            hits[item].fetch_add(1);
            std::this_thread::sleep_for(std::chrono::microseconds(500));
          },
          1, ThreadPool::Guests::welcome);
      visitor.join();
      ok = guest_worker.load() < busy.worker_slots();
      for (auto& h : hits) ok = ok && h.load() == 1;
      home.lend_idle_helpers(false);
    };
    bool lent_ran = false, lent_ok = false, unlent_ran = true, unlent_ok = false;
    run_busy_with_visitor(true, lent_ran, lent_ok);
    run_busy_with_visitor(false, unlent_ran, unlent_ok);
    // No job open: nothing to join.
    home.lend_idle_helpers(true);
    std::vector<std::uint32_t> exhausted;
    const bool idle_ran = home.help_siblings_now(exhausted);
    return std::make_tuple(lent_ran, lent_ok && unlent_ok, unlent_ran, idle_ran);
  });
  CHECK(lent_ran);
  CHECK(lent_ok);
  CHECK_FALSE(unlent_ran);
  CHECK_FALSE(idle_ran);
}

TEST_CASE("default_pool covers the machine's cores", "[thread_pool]") {
  const auto [size, t] = within([] {
    ThreadPool& pool = tilemoe::numa::default_pool();
    return std::make_pair(pool.size(), tally(pool, 257, 2));
  });
  if (std::getenv("TILEMOE_THREADS") == nullptr) {
    CHECK(size == tilemoe::numa::system_topology().cores);
  }
  CHECK(&tilemoe::numa::default_pool() == &tilemoe::numa::default_pool());
  CHECK(each_once(t));
}

TEST_CASE("cost of an empty parallel_for with 2 workers (printed, not checked)", "[thread_pool]") {
  // Two numbers per state: an empty job, which the caller often finishes alone before the helper
  // has entered, and a job whose two items each wait for the other to start, which measures how
  // long it takes until both workers are really at work.
  using clock = std::chrono::steady_clock;
  struct Cost {
    double empty_hot, both_hot, empty_cold, both_cold, single;
  };
  const Cost cost = within([] {
    // The caller on cpus[0], as the runtime is meant to run it: unpinned, it can land on the
    // helper's cpu and the two then take turns instead of running side by side.
    tilemoe::numa::pin_current_thread(two_cpus()[0]);
    ThreadPool pool(2, two_cpus());
    ThreadPool single(1, {});
    const auto empty = [](std::size_t, int) {};
    std::atomic<unsigned> arrived{0};
    const auto both = [&](std::size_t, int) {
      // Even counts mean "both arrived"; spin until the partner's arrival is visible.
      const unsigned mine = arrived.fetch_add(1) + 1;
      for (int spins = 0; arrived.load() < mine + (mine % 2); ++spins) {
        if (spins > 4096) std::this_thread::yield();  // the partner may be waiting for our cpu
      }
    };
    const auto ns_since = [](clock::time_point start) {
      return std::chrono::duration<double, std::nano>(clock::now() - start).count();
    };
    const auto hot = [&](ThreadPool& p, const std::function<void(std::size_t, int)>& fn) {
      for (int i = 0; i < 1000; ++i) p.parallel_for(2, fn);  // warm up
      const auto start = clock::now();
      for (int i = 0; i < 20000; ++i) p.parallel_for(2, fn);
      return ns_since(start) / 20000;
    };
    // Helpers asleep on the futex: the caller pays the wake-up syscall.
    const auto cold = [&](const std::function<void(std::size_t, int)>& fn) {
      double total = 0;
      for (int i = 0; i < 200; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        const auto start = clock::now();
        pool.parallel_for(2, fn);
        total += ns_since(start);
      }
      return total / 200;
    };
    Cost c{};
    c.empty_hot = hot(pool, empty);
    c.both_hot = hot(pool, both);
    c.empty_cold = cold(empty);
    c.both_cold = cold(both);
    c.single = hot(single, empty);
    return c;
  });
  std::printf(
      "parallel_for(2 items), 2 workers, helper spinning: %.0f ns empty, %.0f ns with both "
      "workers engaged\n"
      "parallel_for(2 items), 2 workers, after 1 ms idle (helper asleep): %.0f ns empty, %.0f ns "
      "with both workers engaged\n"
      "parallel_for(2 items), 1 worker: %.0f ns\n",
      cost.empty_hot, cost.both_hot, cost.empty_cold, cost.both_cold, cost.single);
  CHECK(cost.empty_hot > 0);
}
