#include "src/api/task_queue.hpp"

#include <utility>

#include "tilemoe/error.hpp"

namespace tilemoe::api {
namespace {

std::string message_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "an unknown exception";
  }
}

}  // namespace

TaskQueue::TaskQueue() : dispatcher_([this] { dispatcher_main(); }) {}

TaskQueue::~TaskQueue() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  changed_.notify_all();
  dispatcher_.join();
}

TaskQueue::Ticket TaskQueue::submit(std::function<void()> task, const void* scope) {
  Ticket t;
  {
    std::lock_guard<std::mutex> lock(mu_);
    t = ++submitted_;
    queue_.push_back({t, std::move(task), scope});
    if (scope) ++pending_[scope];
  }
  changed_.notify_all();
  return t;
}

void TaskQueue::run_now(const std::function<void()>& task, const void* scope) {
  std::unique_lock<std::mutex> lock(mu_);
  if (busy_ || !queue_.empty()) {
    // Behind queued work: hand it to the dispatcher so the order holds.
    lock.unlock();
    wait(submit(task, scope));
    return;
  }
  throw_if_poisoned(scope);
  busy_ = true;
  lock.unlock();
  std::exception_ptr error;
  try {
    task();
  } catch (...) {
    error = std::current_exception();
  }
  lock.lock();
  busy_ = false;
  lock.unlock();
  changed_.notify_all();
  if (error) std::rethrow_exception(error);
}

void TaskQueue::dispatcher_main() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    changed_.wait(lock, [&] { return (!queue_.empty() && !busy_) || (stop_ && queue_.empty() && !busy_); });
    if (queue_.empty()) return;  // stop_ with nothing left
    Item item = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    std::exception_ptr error;
    auto poison = item.scope ? poisoned_.find(item.scope) : poisoned_.end();
    if (poison != poisoned_.end()) {
      error = std::make_exception_ptr(Error(ErrorKind::state, "not run: task " + std::to_string(poison->second.ticket) +
                                                                  " of this layer failed before it: " + poison->second.message));
    } else {
      lock.unlock();
      try {
        item.task();
      } catch (...) {
        error = std::current_exception();
      }
      item.task = nullptr;  // release what the task holds before others see it finished
      lock.lock();
      if (error && item.scope) poisoned_[item.scope] = {item.ticket, message_of(error)};
    }
    if (error) failures_[item.ticket] = {error, item.scope};
    if (item.scope && --pending_[item.scope] == 0) pending_.erase(item.scope);
    completed_ = item.ticket;
    busy_ = false;
    changed_.notify_all();
  }
}

void TaskQueue::throw_if_poisoned(const void* scope) const {
  if (!scope) return;
  auto it = poisoned_.find(scope);
  if (it != poisoned_.end())
    fail(ErrorKind::state, "not run: task " + std::to_string(it->second.ticket) +
                               " of this layer failed and sync() has not reported it yet: " + it->second.message);
}

std::exception_ptr TaskQueue::take_failure(Ticket ticket) {
  auto it = failures_.find(ticket);
  if (it == failures_.end()) return nullptr;
  std::exception_ptr error = it->second.error;
  auto poison = poisoned_.find(it->second.scope);
  if (poison != poisoned_.end() && poison->second.ticket == ticket) poisoned_.erase(poison);
  failures_.erase(it);
  return error;
}

void TaskQueue::wait(Ticket ticket) {
  std::unique_lock<std::mutex> lock(mu_);
  if (ticket == 0 || ticket > submitted_)
    fail(ErrorKind::invalid_argument, "wait: ticket " + std::to_string(ticket) + " was never handed out by submit");
  changed_.wait(lock, [&] { return completed_ >= ticket; });
  if (std::exception_ptr e = take_failure(ticket)) std::rethrow_exception(e);
}

void TaskQueue::sync() {
  std::unique_lock<std::mutex> lock(mu_);
  const Ticket target = submitted_;
  changed_.wait(lock, [&] { return completed_ >= target; });
  std::exception_ptr first;
  while (!failures_.empty() && failures_.begin()->first <= target) {
    std::exception_ptr e = take_failure(failures_.begin()->first);
    if (!first) first = e;
  }
  if (first) std::rethrow_exception(first);
}

void TaskQueue::drain(const void* scope) {
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait(lock, [&] { return pending_.count(scope) == 0; });
  poisoned_.erase(scope);
}

}  // namespace tilemoe::api
