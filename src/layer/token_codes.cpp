#include "src/layer/token_codes.hpp"

#include <algorithm>
#include <atomic>
#include <string>

#include "src/layer/spin_wait.hpp"
#include "tilemoe/error.hpp"

namespace tilemoe {

void TokenCodes::prepare(int tokens, std::size_t ld) {
  const std::size_t n = static_cast<std::size_t>(std::max(tokens, 0));
  ld_ = ld;
  grow_to(codes_, n * ld);
  grow_to(scales_, n);
  state_.assign(n, kFresh);
}

bool TokenCodes::claim(int t) {
  // A load first: most callers find the token claimed long ago, and a read-modify-write would take
  // the line from the other cores each time. Then a compare-exchange, not an exchange: the token
  // may have been claimed and made ready since the load, and writing "claimed" over "ready" would
  // leave every later caller waiting forever.
  std::atomic_ref<int> state(state_[static_cast<std::size_t>(t)]);
  int fresh = kFresh;
  return state.load(std::memory_order_relaxed) == kFresh && state.compare_exchange_strong(fresh, kClaimed, std::memory_order_relaxed);
}

void TokenCodes::publish(int t, int state) {
  std::atomic_ref<int>(state_[static_cast<std::size_t>(t)]).store(state, std::memory_order_release);
}

void TokenCodes::wait(int t) const {
  // const_cast: atomic_ref needs a non-const object; this only loads. A wait is at most one row's
  // quantization (about a microsecond) unless the claimer lost its core.
  std::atomic_ref<int> state(const_cast<int&>(state_[static_cast<std::size_t>(t)]));
  spin_until([&] {
    const int s = state.load(std::memory_order_acquire);
    if (s == kFailed) fail(ErrorKind::state, "forward: quantizing token " + std::to_string(t) + "'s input failed in another worker");
    return s == kReady;
  });
}

}  // namespace tilemoe
