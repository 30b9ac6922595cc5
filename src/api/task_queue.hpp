#pragma once
// The async API's queue: tasks run one at a time, in submission order, on the queue's own
// thread, which then drives the thread pool. A GPU server thread submits a layer's experts,
// goes on with attention, and syncs later.
//
// Failures are sticky per scope (a layer): once a task of a scope fails, the tasks of that scope
// queued after it are not run (each fails with Error(state) naming the first failure) until the
// failure is reported by wait or sync. Without this a failed forward_sft would leave its
// backward to pop an older saved forward and return wrong gradients.
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>

namespace tilemoe::api {

class TaskQueue {
 public:
  using Ticket = std::uint64_t;  // 1, 2, 3... in submission order

  TaskQueue();
  ~TaskQueue();  // runs every queued task, then stops; unreported failures are dropped
  TaskQueue(const TaskQueue&) = delete;
  TaskQueue& operator=(const TaskQueue&) = delete;

  // Returns at once. `scope` groups tasks whose failures must stop the ones after them (nullptr:
  // none). Any thread may submit.
  Ticket submit(std::function<void()> task, const void* scope);

  // Runs `task` on the calling thread after every task already queued, and before any submitted
  // later; throws what it throws. The synchronous API: no thread hand-off when the queue is idle.
  void run_now(const std::function<void()>& task, const void* scope);

  // Waits for one task and rethrows its failure if no sync reported it yet.
  void wait(Ticket ticket);
  // Waits for every task submitted before the call and rethrows the first failure among them not
  // yet reported (later ones, often tasks skipped because of it, are dropped).
  void sync();
  // Waits until no task of `scope` is queued or running, and forgets the scope's sticky failure:
  // what a layer's destructor needs. Failures stay for sync to report.
  void drain(const void* scope);

 private:
  struct Item {
    Ticket ticket;
    std::function<void()> task;
    const void* scope;
  };
  struct Failure {
    std::exception_ptr error;
    const void* scope;
  };
  struct Poison {
    Ticket ticket;
    std::string message;
  };

  void dispatcher_main();
  // With mu_ held: throws Error(state) when `scope` has an unreported failure.
  void throw_if_poisoned(const void* scope) const;
  // With mu_ held: removes a failure and the poison it caused; returns its error.
  std::exception_ptr take_failure(Ticket ticket);

  mutable std::mutex mu_;
  std::condition_variable changed_;
  std::deque<Item> queue_;
  bool busy_ = false;  // a task runs (on the dispatcher or in run_now)
  bool stop_ = false;
  Ticket submitted_ = 0, completed_ = 0;
  std::map<Ticket, Failure> failures_;
  std::map<const void*, Poison> poisoned_;
  std::map<const void*, int> pending_;  // queued or running tasks per scope
  std::thread dispatcher_;
};

}  // namespace tilemoe::api
