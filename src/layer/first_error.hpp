#pragma once
// The first failure among threads that share one piece of work: fail() keeps the first error and
// raises a flag that the others poll while they wait (and then stop); the owner of the work
// rethrows error() once every thread has returned.
#include <atomic>
#include <exception>
#include <mutex>

namespace tilemoe {

class FirstError {
 public:
  void fail(std::exception_ptr error) noexcept {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!error_) error_ = error;
    }
    failed_.store(true, std::memory_order_release);
  }
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  std::exception_ptr error() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return error_;
  }
  // Before the next piece of work, on one thread.
  void reset() {
    std::lock_guard<std::mutex> lock(mutex_);
    error_ = nullptr;
    failed_.store(false, std::memory_order_relaxed);
  }

 private:
  std::atomic<bool> failed_{false};
  mutable std::mutex mutex_;
  std::exception_ptr error_;
};

}  // namespace tilemoe
