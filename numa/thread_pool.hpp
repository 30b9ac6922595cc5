#pragma once
// The only place in the runtime that creates threads. A pool's workers are created once, pinned,
// and then reused by every parallel_for, so that the ~1 ms decode step never pays for thread
// creation and the caches and memory of a worker stay on its core.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace tilemoe::numa {

namespace detail {
struct CallFrame;
struct LinkSet;
}

class ThreadPool {
 public:
  // `threads` workers; the thread that calls parallel_for is worker 0 and does its share of the
  // items, so threads - 1 helper threads are created. threads <= 0 means cpus.size() (1 when
  // cpus is empty). Helper i is pinned to cpus[i]; helpers beyond cpus.size() are not pinned,
  // because two spinning workers on one cpu would slow each other down. The calling thread is
  // not pinned either: it belongs to the caller, and changing its affinity would outlive the
  // call. cpus[0] is left for it; pin_current_thread(cpus[0]) pins it if the caller wants that.
  // A pinning failure prints one warning on stderr per process and the worker runs unpinned.
  // Throws tilemoe::Error(invalid_argument) for threads > 4096, std::system_error if a thread
  // cannot be created.
  ThreadPool(int threads, std::vector<int> cpus);
  ~ThreadPool();  // joins the helpers; no parallel_for may be running

  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const noexcept { return size_; }
  // How many distinct `worker` values parallel_for can pass: size() plus the slots of guests,
  // the workers of sibling pools (link_siblings: their helpers, and the threads that drive them,
  // help_siblings_now) that join a job opened with Guests::welcome. Per-worker scratch is sized
  // by this.
  int worker_slots() const noexcept { return size_ + guest_slots_; }

  // Whether a job may be joined by the idle helpers of sibling pools (link_siblings).
  enum class Guests { no, welcome };

  // Runs fn(item, worker) once for every item in [0, count) and returns when all are done.
  // Items are handed out `grain` at a time from a shared counter, so a worker that finishes early
  // takes more and uneven items balance out. `worker` is in [0, worker_slots()) and no two calls
  // of fn running at the same time share one, so it can index per-worker scratch. Only a job with
  // Guests::welcome is joined by guests (worker >= size(), see link_siblings): they take items
  // from the same counter, one at a time.
  //
  // If fn throws, items not yet started are skipped, and once every worker has stopped the first
  // exception is rethrown here; the pool stays usable.
  //
  // Not re-entrant: calling parallel_for on this pool from inside fn (directly, or through
  // another pool's parallel_for) throws tilemoe::Error(ErrorKind::state), because the workers it
  // would need are busy running the outer call. Calling a different pool from inside fn is
  // allowed; two pools calling each other from different threads at once can deadlock, as any
  // two mutexes taken in opposite orders do.
  //
  // Calls from several threads at once are serialised by a mutex: each runs with all workers,
  // one after the other.
  void parallel_for(std::size_t count, const std::function<void(std::size_t item, int worker)>& fn,
                    std::size_t grain = 1, Guests guests = Guests::no);

  // Pools whose workers share one memory node (virtual NUMA nodes of one real node): while a pool
  // lends its idle helpers (lend_idle_helpers), they poll the others' open Guests::welcome jobs
  // and join them, so that a node that has ended its share of a layer helps the ones still at it
  // instead of waiting for them. Reading a sibling's weights costs nothing there; across real
  // nodes it would, which is why NodeGroup links only pools of one memory node. Call before the
  // pools' first parallel_for (worker_slots() grows here), from one thread, at most once a pool.
  // The first pool of a set to be destroyed joins the helpers of all (they poll each other): the
  // others then run their jobs on their callers alone.
  static void link_siblings(const std::vector<ThreadPool*>& pools);

  // Whether this pool's idle helpers join its siblings' welcoming jobs (off at first). A guest
  // goes back after its item once lending stops or its own pool opens a job: a pool about to
  // run work of its own should not lend, or its helpers come back an item late.
  void lend_idle_helpers(bool on) noexcept { lending_.store(on, std::memory_order_relaxed); }
  // The calling thread, which runs no job of this pool (a NodeGroup's dispatcher whose node is
  // done), joins the siblings' open welcoming jobs as this pool's helpers do while it lends, each
  // until it has no items left; `exhausted` (one entry per sibling, kept by the caller between
  // calls) records which jobs it has run out of. True if it ran any item.
  bool help_siblings_now(std::vector<std::uint32_t>& exhausted);
  // Items of this pool's jobs that guests ran, since construction (the bench's --phases).
  std::uint64_t guest_items() const noexcept { return guest_items_.load(std::memory_order_relaxed); }

  // Helpers that are idle, or become idle, stop polling for a job and sleep until the next
  // parallel_for wakes them. After a job they otherwise poll for a while (kSpinTime), which is
  // what back-to-back calls want; a caller that knows other threads are about to run on these
  // cores (the bench taking turns between thread groups on the same cores) parks the pool so
  // that its polling does not take their time.
  void park() noexcept { park_.store(true, std::memory_order_relaxed); }

 private:
  void helper_main(int worker, int cpu);
  // Returns once no item is left (true), or, for a guest (home != null), false once home wants
  // its helper back (home_wants: a new job there, or no more lending) after an item.
  bool run_items(int worker, const ThreadPool* home = nullptr, std::uint32_t home_epoch = 0);
  bool home_wants(std::uint32_t seen) const noexcept;
  std::uint32_t await_open_job(std::uint32_t seen);
  // A helper of a sibling pool (`home`, whose last job it saw was home_epoch) joins this pool's
  // open job if it welcomes guests and a guest slot is free, unless it ran out of that job's items
  // before (its epoch is `exhausted`, updated). True if it ran any item.
  bool join_as_guest(const ThreadPool& home, std::uint32_t home_epoch, std::uint32_t& exhausted);
  // While this pool lends and has siblings: joins their open jobs for this pool, whose last job
  // seen is home_epoch (an idle helper's, or help_siblings_now's). True if it ran any item.
  bool help_siblings(std::vector<std::uint32_t>& exhausted, std::uint32_t home_epoch);
  void await_helpers_out();
  void stop_helpers() noexcept;

  int size_ = 1;
  int guest_slots_ = 0;                 // link_siblings: the sibling pools' workers
  std::unique_ptr<std::atomic<bool>[]> guest_slot_taken_;  // a guest holds one while inside a job
  std::atomic<bool> lending_{false};
  std::atomic<std::uint64_t> guest_items_{0};
  // Whose welcoming jobs our idle helpers join: written once by link_siblings, while the helpers
  // already poll, and published to them through siblings_ (release / acquire).
  std::vector<ThreadPool*> sibling_list_;
  std::atomic<const std::vector<ThreadPool*>*> siblings_{nullptr};
  std::shared_ptr<detail::LinkSet> link_;  // the linked set, which outlives each of its pools
  std::vector<std::thread> helpers_;
  std::mutex call_mutex_;

  // The job: written by the caller while no helper is inside (active_ == 0) and before it opens
  // the job; read by a helper only after it has entered the job.
  const std::function<void(std::size_t, int)>* fn_ = nullptr;
  std::size_t count_ = 0;
  std::size_t grain_ = 1;
  const detail::CallFrame* frame_ = nullptr;
  bool welcome_guests_ = false;
  std::exception_ptr error_;  // written only by the thread that set failed_

  // Separate cache lines: next_ is hammered while items run, epoch_ is polled by idle helpers,
  // active_ is hit as helpers enter and leave.
  alignas(64) std::atomic<std::size_t> next_{0};
  std::atomic<bool> failed_{false};
  alignas(64) std::atomic<std::uint32_t> epoch_{0};  // odd: a job is open; even: closed
  std::atomic<std::uint32_t> sleepers_{0};           // helpers asleep (or about to be) on epoch_
  std::atomic<bool> stop_{false};
  std::atomic<bool> park_{false};  // park(): idle helpers sleep at once; the next job clears it
  alignas(64) std::atomic<std::uint32_t> active_{0};           // helpers (and guests) inside the job
  std::atomic<std::uint32_t> caller_sleeping_{0};              // caller asleep on active_
};

// Process-wide pool over every physical core of every node, in node order, created on first use.
// Its size is TILEMOE_THREADS when set (a positive integer; anything else makes this throw
// tilemoe::Error(invalid_argument)), else the number of cores. Never destroyed, so code running
// in static destructors can still use it. Do not fork() a process that has used it: the child
// has no helper threads and its first parallel_for would hang.
ThreadPool& default_pool();

// Pins the calling thread to one OS cpu. Returns false (and changes nothing) if the kernel
// refuses, e.g. for a cpu outside the process's cpuset.
bool pin_current_thread(int cpu);

}  // namespace tilemoe::numa
