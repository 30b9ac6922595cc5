#pragma once
// Waiting for work that other workers do. The work waited for is short (tens of microseconds),
// so spin first; past that the thread doing it may have lost its core (more threads than cores),
// so give the core up.
#include <atomic>
#include <thread>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace tilemoe {

// Returns once done() does; done() may throw to stop the wait.
template <typename Done>
void spin_until(Done done) {
  for (unsigned spins = 0; !done(); ++spins) {
    if (spins < 4096) {
#if defined(__x86_64__) || defined(__i386__)
      _mm_pause();
#endif
    } else {
      std::this_thread::yield();
    }
  }
}

// Waiting for a counter that other workers count down to zero (acquire: their writes are visible
// after). `check` runs every round and throws to stop the wait (another item failed).
template <typename Check>
void spin_until_zero(const int& counter, Check check) {
  // const_cast: atomic_ref needs a non-const object; this only loads.
  std::atomic_ref<int> count(const_cast<int&>(counter));
  spin_until([&] {
    if (count.load(std::memory_order_acquire) == 0) return true;
    check();
    return false;
  });
}

}  // namespace tilemoe
