#pragma once
// Waiting for a counter that other workers count down to zero (acquire: their writes are visible
// after). The work waited for is short (tens of microseconds), so spin first; past that the
// thread doing it may have lost its core (more threads than cores), so give the core up. `check`
// runs every round and throws to stop the wait (another item failed).
#include <atomic>
#include <thread>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace tilemoe {

template <typename Check>
void spin_until_zero(const int& counter, Check check) {
  // const_cast: atomic_ref needs a non-const object; this only loads.
  std::atomic_ref<int> count(const_cast<int&>(counter));
  for (unsigned spins = 0; count.load(std::memory_order_acquire) != 0; ++spins) {
    check();
    if (spins < 4096) {
#if defined(__x86_64__) || defined(__i386__)
      _mm_pause();
#endif
    } else {
      std::this_thread::yield();
    }
  }
}

}  // namespace tilemoe
