#include "src/layer/item_countdowns.hpp"

#include <stdexcept>
#include <string>

#include "src/layer/spin_wait.hpp"

namespace tilemoe {

void ItemCountdowns::reset(std::size_t n) {
  counts_.assign(n, 0);
  after_.assign(n, 0);
  failed_.store(false, std::memory_order_relaxed);
  error_ = nullptr;
}

void ItemCountdowns::wait(std::size_t i) {
  spin_until_zero(counts_[i], [this] {
    if (failed_.load(std::memory_order_acquire)) throw Stopped{};
  });
}

void ItemCountdowns::wait(std::size_t i, std::size_t slot) {
  if (after_[i] > slot)
    throw std::logic_error("ItemCountdowns: the item in slot " + std::to_string(slot) + " waits for counter " + std::to_string(i) +
                           ", which the item in slot " + std::to_string(after_[i] - 1) + " counts down: a waited-for item must come first");
  wait(i);
}

void ItemCountdowns::parallel_for(numa::ThreadPool& pool, std::size_t count, const std::function<void(std::size_t, int)>& fn,
                                  numa::ThreadPool::Guests guests) {
  auto run = [&](std::size_t item, int worker) {
    try {
      fn(item, worker);
    } catch (const Stopped&) {
      throw;
    } catch (...) {
      {
        std::lock_guard<std::mutex> lock(error_mutex_);
        if (!error_) error_ = std::current_exception();
      }
      failed_.store(true, std::memory_order_release);
      throw;
    }
  };
  try {
    pool.parallel_for(count, run, 1, guests);
  } catch (...) {
    // The pool rethrows the first exception to reach it, which may be a waiting item's Stopped.
    if (error_) std::rethrow_exception(error_);
    throw;
  }
}

}  // namespace tilemoe
