#pragma once
// Items of one parallel_for that wait for earlier items of the same call: a phase can start its
// main items while the few that prepare their inputs (the LoRA's x Aᵀ, its packed factors) still
// run, instead of a phase of its own whose end every core waits for.
//
// The pool hands items out in increasing order, one at a time to each worker, so an item that
// waits only for items before it in the list cannot deadlock: the earliest unfinished item has
// nothing left to wait for. Which worker runs what changes the timing only: every item computes
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
  // In the item that counter i waited for, once its results are written (release).
  void count_down(std::size_t i) { std::atomic_ref<int>(counts_[i]).fetch_sub(1, std::memory_order_acq_rel); }
  // Returns once counter i is zero (acquire: the counted items' writes are visible). Spins, then
  // yields, so a pool with more threads than cores still progresses. Throws if an item of the call
  // failed, so that nothing waits forever for an item that will not finish.
  void wait(std::size_t i);

  // pool.parallel_for(count, fn, 1, guests) for items that wait through this object: if one throws,
  // the items waiting stop too, and the first exception is the one rethrown. Guests take items from
  // the same counter in the same order, so the order argument above holds with them.
  void parallel_for(numa::ThreadPool& pool, std::size_t count, const std::function<void(std::size_t item, int worker)>& fn,
                    numa::ThreadPool::Guests guests = numa::ThreadPool::Guests::no);

 private:
  struct Stopped {};  // what a waiting item throws once another has failed
  std::vector<int> counts_;
  std::atomic<bool> failed_{false};
  std::mutex error_mutex_;
  std::exception_ptr error_;
};

}  // namespace tilemoe
