#include "src/layer/item_countdowns.hpp"

#include <thread>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace tilemoe {

void ItemCountdowns::reset(std::size_t n) {
  counts_.assign(n, 0);
  failed_.store(false, std::memory_order_relaxed);
  error_ = nullptr;
}

void ItemCountdowns::wait(std::size_t i) {
  std::atomic_ref<int> count(counts_[i]);
  for (unsigned spins = 0; count.load(std::memory_order_acquire) != 0; ++spins) {
    if (failed_.load(std::memory_order_acquire)) throw Stopped{};
    // The items waited for are short (tens of microseconds): spin first. Past that the thread
    // running them may have lost its core (more threads than cores): give it up.
    if (spins < 4096) {
#if defined(__x86_64__) || defined(__i386__)
      _mm_pause();
#endif
    } else {
      std::this_thread::yield();
    }
  }
}

void ItemCountdowns::parallel_for(numa::ThreadPool& pool, std::size_t count, const std::function<void(std::size_t, int)>& fn) {
  try {
    pool.parallel_for(count, [&](std::size_t item, int worker) {
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
    });
  } catch (...) {
    // The pool rethrows the first exception to reach it, which may be a waiting item's Stopped.
    if (error_) std::rethrow_exception(error_);
    throw;
  }
}

}  // namespace tilemoe
