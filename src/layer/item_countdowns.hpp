#pragma once
// Items of one parallel_for that wait for earlier items of the same call: a phase can start its
// main items while the few that prepare their inputs (the LoRA's x Aᵀ, its packed factors) still
// run, instead of a phase of its own whose end every core waits for.
//
// The pool hands items out in increasing order, one at a time to each worker, so an item that
// waits only for items before it in the list cannot deadlock: the earliest unfinished item has
// nothing left to wait for (the layers name their items' slots, so that every call checks that
// order: expect and wait below). Which worker runs what changes the timing only: every item computes
// the same values, so the output bits do not depend on the order or on the thread count.
#include <atomic>
#include <cstddef>
#include <exception>
#include <functional>
#include <mutex>
#include <vector>

#include "numa/thread_pool.hpp"

namespace tilemoe {

class ItemCountdowns {
 public:
  // n counters, all zero; clears a failure of the previous call.
  void reset(std::size_t n);
  // Before the parallel_for: one more item that counter i waits for.
  void expect(std::size_t i) { ++counts_[i]; }
  // The same, naming that item's slot in the parallel_for. A wait that names its own slot then
  // checks that every item so named comes before it, the order that rules out a deadlock: a wrong
  // order is a logic_error on every call, where it would otherwise hang only on some thread counts.
  void expect(std::size_t i, std::size_t producer_slot) {
    ++counts_[i];
    produced_by(i, producer_slot);
  }
  // Names a slot that may count counter i down without counting it here: where which of several
  // items counts it down is decided as they run (the last of an expert's items, say), each of them.
  void produced_by(std::size_t i, std::size_t slot) {
    if (slot + 1 > after_[i]) after_[i] = slot + 1;
  }
  // In the item that counter i waited for, once its results are written (release).
  void count_down(std::size_t i) { std::atomic_ref<int>(counts_[i]).fetch_sub(1, std::memory_order_acq_rel); }
  // Returns once counter i is zero (acquire: the counted items' writes are visible). Spins, then
  // yields, so a pool with more threads than cores still progresses. Throws if an item of the call
  // failed, so that nothing waits forever for an item that will not finish.
  void wait(std::size_t i);
  // wait(i) from the item in `slot`, after checking the order (see expect).
  void wait(std::size_t i, std::size_t slot);

  // pool.parallel_for(count, fn, 1, guests) for items that wait through this object: if one throws,
  // the items waiting stop too, and the first exception is the one rethrown. Guests take items from
  // the same counter in the same order, so the order argument above holds with them.
  void parallel_for(numa::ThreadPool& pool, std::size_t count, const std::function<void(std::size_t item, int worker)>& fn,
                    numa::ThreadPool::Guests guests = numa::ThreadPool::Guests::no);

 private:
  struct Stopped {};  // what a waiting item throws once another has failed
  std::vector<int> counts_;
  std::vector<std::size_t> after_;  // per counter: 1 + the last slot named by expect or produced_by, 0 for none
  std::atomic<bool> failed_{false};
  std::mutex error_mutex_;
  std::exception_ptr error_;
};

}  // namespace tilemoe
