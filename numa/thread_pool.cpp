#include "numa/thread_pool.hpp"

#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "numa/topology.hpp"
#include "tilemoe/error.hpp"

namespace tilemoe::numa {

namespace detail {
// One link per parallel_for a thread is inside of, outermost last. Helpers run with the caller's
// chain, so re-entry is caught even when it comes back through another pool.
struct CallFrame {
  const ThreadPool* pool;
  const CallFrame* parent;
};

// Pools linked by link_siblings; the first to go stops every helper of the set.
struct LinkSet {
  std::mutex mutex;
  std::vector<ThreadPool*> pools;  // those not yet destroyed
};
}  // namespace detail

namespace {

using detail::CallFrame;

constexpr int kMaxThreads = 4096;

// How long an idle thread polls before it sleeps. A decode step runs a few parallel_for phases
// within ~1 ms, so back-to-back phases find the helpers awake and the caller needs no syscall;
// a process that stops calling costs at most this much spinning per helper.
constexpr auto kSpinTime = std::chrono::microseconds(100);

thread_local const CallFrame* tl_frame = nullptr;

// Restores the thread's frame chain however the scope is left.
class FrameScope {
 public:
  explicit FrameScope(const CallFrame* frame) : saved_(tl_frame) { tl_frame = frame; }
  ~FrameScope() { tl_frame = saved_; }
  FrameScope(const FrameScope&) = delete;
  FrameScope& operator=(const FrameScope&) = delete;

 private:
  const CallFrame* saved_;
};

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

// std::atomic<uint32_t> has the size and layout of a uint32_t on every target we build for; the
// kernel only compares and sleeps on the word.
std::uint32_t* futex_word(std::atomic<std::uint32_t>& a) {
  static_assert(sizeof(std::atomic<std::uint32_t>) == sizeof(std::uint32_t));
  return reinterpret_cast<std::uint32_t*>(&a);
}

// Sleeps only while the word still holds `expected`; the kernel checks that atomically with
// going to sleep, which is what rules out a wake-up lost between our check and the sleep.
void futex_wait(std::atomic<std::uint32_t>& word, std::uint32_t expected) {
  syscall(SYS_futex, futex_word(word), FUTEX_WAIT_PRIVATE, expected, nullptr, nullptr, 0);
}

void futex_wake(std::atomic<std::uint32_t>& word, int count) {
  syscall(SYS_futex, futex_word(word), FUTEX_WAKE_PRIVATE, count, nullptr, nullptr, 0);
}

// Polls until ready() or the spin time has passed; the clock is read only every 64 polls so
// that a spinning thread reacts within a few hundred nanoseconds.
template <class Ready>
bool spin_until(Ready ready) {
  const auto deadline = std::chrono::steady_clock::now() + kSpinTime;
  for (unsigned i = 1;; ++i) {
    if (ready()) return true;
    cpu_relax();
    if (i % 64 == 0 && std::chrono::steady_clock::now() >= deadline) return ready();
  }
}

void warn_pinning_failed(int cpu, int err) {
  static std::atomic<bool> warned{false};
  if (warned.exchange(true)) return;
  std::fprintf(stderr,
               "tilemoe: warning: cannot pin a worker thread to cpu %d (%s); workers run unpinned "
               "where pinning fails\n",
               cpu, std::strerror(err));
}

int pin_thread(int cpu) {
  if (cpu < 0) return EINVAL;
  cpu_set_t* set = CPU_ALLOC(cpu + 1);
  if (set == nullptr) return ENOMEM;
  const std::size_t size = CPU_ALLOC_SIZE(cpu + 1);
  CPU_ZERO_S(size, set);
  CPU_SET_S(static_cast<std::size_t>(cpu), size, set);
  const int err = pthread_setaffinity_np(pthread_self(), size, set);
  CPU_FREE(set);
  return err;
}

}  // namespace

bool pin_current_thread(int cpu) { return pin_thread(cpu) == 0; }

ThreadPool::ThreadPool(int threads, std::vector<int> cpus) {
  if (threads > kMaxThreads) {
    fail(ErrorKind::invalid_argument, "ThreadPool: " + std::to_string(threads) +
                                          " threads requested, at most " +
                                          std::to_string(kMaxThreads) + " supported");
  }
  if (threads <= 0) {
    threads = static_cast<int>(std::clamp<std::size_t>(cpus.size(), 1, kMaxThreads));
  }
  size_ = threads;
  helpers_.reserve(static_cast<std::size_t>(size_ - 1));
  try {
    for (int worker = 1; worker < size_; ++worker) {
      const std::size_t slot = static_cast<std::size_t>(worker);
      const int cpu = slot < cpus.size() ? cpus[slot] : -1;
      helpers_.emplace_back([this, worker, cpu] { helper_main(worker, cpu); });
    }
  } catch (...) {
    stop_helpers();
    throw;
  }
}

ThreadPool::~ThreadPool() {
  if (!link_) {
    stop_helpers();
    return;
  }
  // Every helper of the set polls the others: all stop before this pool's memory goes.
  std::lock_guard<std::mutex> lock(link_->mutex);
  for (ThreadPool* p : link_->pools) p->stop_helpers();
  std::erase(link_->pools, this);
}

// How a job runs, and why it is safe:
//  - The caller writes the job, then opens it by making epoch_ odd. Helpers that see a new odd
//    epoch try to enter: active_ + 1, then check that epoch_ still holds the value they saw.
//  - When the caller has claimed every item (or one failed) it closes the job by making epoch_
//    even, and waits until active_ is 0. It never waits for a helper that has not entered: a
//    helper asleep or descheduled costs the caller nothing, it just finds the job closed.
//  - Enter (write active_, read epoch_) and close (write epoch_, read active_) are seq_cst, so
//    either the helper sees the close and leaves without touching the job, or the caller sees
//    the helper and waits for it. Job fields are therefore never read while being rewritten.
//  - ABA: a helper compares the full 32-bit epoch. Once it is counted in active_, the caller
//    cannot get past the next close, so the epoch would have to wrap (2^31 calls) between the
//    helper's read of epoch_ and its increment of active_, two instructions apart.

void ThreadPool::stop_helpers() noexcept {
  {
    std::lock_guard<std::mutex> lock(call_mutex_);
    stop_.store(true, std::memory_order_seq_cst);
    epoch_.fetch_add(1, std::memory_order_seq_cst);
    futex_wake(epoch_, INT_MAX);
  }
  for (auto& t : helpers_) t.join();
  helpers_.clear();
}

std::uint32_t ThreadPool::await_open_job(std::uint32_t seen) {
  std::uint32_t now = seen;
  const auto ready = [&] {
    now = epoch_.load(std::memory_order_acquire);
    return (now != seen && now % 2 == 1) || stop_.load(std::memory_order_relaxed);
  };
  // While it polls, a helper of a linked, lending pool joins the siblings' jobs; after one it
  // polls its own pool afresh for the spin time.
  thread_local std::vector<std::uint32_t> exhausted;  // a helper serves one pool: its siblings' epochs
  for (;;) {
    bool helped = false;
    const bool woke = spin_until([&] {
      if (ready() || park_.load(std::memory_order_relaxed)) return true;
      helped = help_siblings(exhausted, seen);
      return helped;
    });
    if (helped) continue;
    if (woke && ready()) return now;
    break;  // parked, or nothing came within the spin time
  }
  // Pairs with the caller's open in parallel_for: either we see the new epoch before we sleep,
  // or the caller sees us in sleepers_ and wakes us. The kernel re-checks the word as it puts
  // us to sleep, so a change between our load and the sleep is not lost either.
  sleepers_.fetch_add(1, std::memory_order_seq_cst);
  for (;;) {
    now = epoch_.load(std::memory_order_seq_cst);
    if ((now != seen && now % 2 == 1) || stop_.load(std::memory_order_seq_cst)) break;
    futex_wait(epoch_, now);
  }
  sleepers_.fetch_sub(1, std::memory_order_seq_cst);
  return now;
}

void ThreadPool::await_helpers_out() {
  if (spin_until([&] { return active_.load(std::memory_order_acquire) == 0; })) return;
  // Mirror of the pairing above: the last helper out sees caller_sleeping_ or we see active_ 0.
  caller_sleeping_.store(1, std::memory_order_seq_cst);
  std::uint32_t inside;
  while ((inside = active_.load(std::memory_order_seq_cst)) != 0) futex_wait(active_, inside);
  caller_sleeping_.store(0, std::memory_order_relaxed);
}

void ThreadPool::helper_main(int worker, int cpu) {
  if (cpu >= 0) {
    if (const int err = pin_thread(cpu); err != 0) warn_pinning_failed(cpu, err);
  }
  char name[16];
  std::snprintf(name, sizeof name, "tilemoe-w%d", worker);
  pthread_setname_np(pthread_self(), name);

  std::uint32_t seen = 0;
  for (;;) {
    seen = await_open_job(seen);
    if (stop_.load(std::memory_order_acquire)) return;
    active_.fetch_add(1, std::memory_order_seq_cst);
    if (epoch_.load(std::memory_order_seq_cst) == seen) {
      FrameScope scope(frame_);
      run_items(worker);
    }
    // The caller may rewrite the job as soon as active_ reaches 0: nothing of it is read below.
    if (active_.fetch_sub(1, std::memory_order_seq_cst) == 1 &&
        caller_sleeping_.load(std::memory_order_seq_cst) != 0) {
      futex_wake(active_, 1);
    }
  }
}

bool ThreadPool::home_wants(std::uint32_t seen) const noexcept {
  const std::uint32_t e = epoch_.load(std::memory_order_relaxed);
  return (e != seen && e % 2 == 1) || !lending_.load(std::memory_order_relaxed) || stop_.load(std::memory_order_relaxed);
}

bool ThreadPool::run_items(int worker, const ThreadPool* home, std::uint32_t home_epoch) {
  const auto& fn = *fn_;
  const std::size_t count = count_;
  const std::size_t grain = home ? 1 : grain_;
  try {
    for (;;) {
      if (home && home->home_wants(home_epoch)) return false;
      const std::size_t begin = next_.fetch_add(grain, std::memory_order_relaxed);
      if (begin >= count) return true;
      const std::size_t end = std::min(count, begin + grain);
      for (std::size_t item = begin; item < end; ++item) {
        if (failed_.load(std::memory_order_relaxed)) return true;
        if (home) guest_items_.fetch_add(1, std::memory_order_relaxed);
        fn(item, worker);
      }
    }
  } catch (...) {
    if (!failed_.exchange(true, std::memory_order_acq_rel)) error_ = std::current_exception();
  }
  return true;
}

// A guest enters and leaves a job as the pool's own helpers do (active_, then the epoch checked
// again; see above), so the caller waits for it like for them and never rewrites a job a guest
// reads. Its worker number is size_ plus a slot it holds while inside: no two guests inside at
// once share one. A guest called back home may come again to the same job later.
bool ThreadPool::join_as_guest(const ThreadPool& home, std::uint32_t home_epoch, std::uint32_t& exhausted) {
  const std::uint32_t e = epoch_.load(std::memory_order_acquire);
  if (e % 2 == 0 || e == exhausted) return false;
  active_.fetch_add(1, std::memory_order_seq_cst);
  bool ran = false;
  // stop_helpers also makes the epoch odd, with stop_ set before: no job is open then.
  if (epoch_.load(std::memory_order_seq_cst) == e && !stop_.load(std::memory_order_seq_cst) && welcome_guests_) {
    for (int slot = 0; slot < guest_slots_; ++slot) {
      if (guest_slot_taken_[static_cast<std::size_t>(slot)].exchange(true, std::memory_order_acquire)) continue;
      {
        FrameScope scope(frame_);
        if (run_items(size_ + slot, &home, home_epoch)) exhausted = e;
      }
      guest_slot_taken_[static_cast<std::size_t>(slot)].store(false, std::memory_order_release);
      ran = true;
      break;
    }
  }
  if (active_.fetch_sub(1, std::memory_order_seq_cst) == 1 && caller_sleeping_.load(std::memory_order_seq_cst) != 0) {
    futex_wake(active_, 1);
  }
  return ran;
}

bool ThreadPool::help_siblings(std::vector<std::uint32_t>& exhausted, std::uint32_t home_epoch) {
  const std::vector<ThreadPool*>* siblings = siblings_.load(std::memory_order_acquire);
  if (siblings == nullptr || !lending_.load(std::memory_order_relaxed)) return false;
  if (exhausted.size() != siblings->size()) exhausted.assign(siblings->size(), 0);
  bool ran = false;
  for (std::size_t i = 0; i < siblings->size() && !home_wants(home_epoch); ++i)
    ran = (*siblings)[i]->join_as_guest(*this, home_epoch, exhausted[i]) || ran;
  return ran;
}

bool ThreadPool::help_siblings_now(std::vector<std::uint32_t>& exhausted) {
  return help_siblings(exhausted, epoch_.load(std::memory_order_acquire));
}

void ThreadPool::link_siblings(const std::vector<ThreadPool*>& pools) {
  if (pools.size() < 2) return;
  for (const ThreadPool* p : pools)
    if (p->link_) fail(ErrorKind::state, "ThreadPool::link_siblings: a pool is already linked");
  auto set = std::make_shared<detail::LinkSet>();
  set->pools = pools;
  for (ThreadPool* p : pools) {
    p->link_ = set;
    for (ThreadPool* q : pools) {
      if (q == p) continue;
      p->sibling_list_.push_back(q);
      p->guest_slots_ += q->size_;  // q's helpers, and the thread that drives q (help_siblings_now)
    }
    p->guest_slot_taken_ = std::make_unique<std::atomic<bool>[]>(static_cast<std::size_t>(p->guest_slots_));
  }
  // Only now may helpers join: what they read of every pool (guest_slots_ above) is written.
  for (ThreadPool* p : pools) p->siblings_.store(&p->sibling_list_, std::memory_order_release);
}

void ThreadPool::parallel_for(std::size_t count,
                              const std::function<void(std::size_t item, int worker)>& fn,
                              std::size_t grain, Guests guests) {
  for (const CallFrame* f = tl_frame; f != nullptr; f = f->parent) {
    if (f->pool == this) {
      fail(ErrorKind::state,
           "ThreadPool::parallel_for called from inside a task of the same pool; nested "
           "parallel_for on one pool is not supported");
    }
  }
  if (count == 0) return;
  grain = std::clamp<std::size_t>(grain, 1, count);
  // next_ overshoots count by at most one grain per worker; keep that from wrapping around.
  if (count > SIZE_MAX / (2 * static_cast<std::size_t>(kMaxThreads))) {
    fail(ErrorKind::invalid_argument,
         "ThreadPool::parallel_for: " + std::to_string(count) + " items is too many");
  }
  const std::size_t chunks = (count + grain - 1) / grain;

  std::lock_guard<std::mutex> lock(call_mutex_);
  const CallFrame frame{this, tl_frame};
  FrameScope scope(&frame);

  const bool welcome = guests == Guests::welcome && guest_slots_ > 0;
  if ((size_ == 1 && !welcome) || chunks == 1) {
    // One chunk keeps one worker busy; waking the others would only add latency.
    for (std::size_t item = 0; item < count; ++item) fn(item, 0);
    return;
  }

  fn_ = &fn;
  count_ = count;
  grain_ = grain;
  frame_ = &frame;
  welcome_guests_ = welcome;
  next_.store(0, std::memory_order_relaxed);
  failed_.store(false, std::memory_order_relaxed);
  error_ = nullptr;
  park_.store(false, std::memory_order_relaxed);

  // Open: the seq_cst increment also releases the job written above. Spinning helpers cost no
  // syscall; of the sleeping ones, wake no more than there are chunks left for them.
  epoch_.fetch_add(1, std::memory_order_seq_cst);
  if (sleepers_.load(std::memory_order_seq_cst) != 0) {
    futex_wake(epoch_, static_cast<int>(std::min<std::size_t>(chunks - 1, INT_MAX)));
  }
  run_items(0);
  // Every item is claimed (or skipped after a failure): close, then let the helpers still
  // running items finish.
  epoch_.fetch_add(1, std::memory_order_seq_cst);
  await_helpers_out();

  fn_ = nullptr;
  frame_ = nullptr;
  welcome_guests_ = false;
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

ThreadPool& default_pool() {
  static ThreadPool* const pool = [] {
    std::vector<int> cpus;
    for (const auto& node : system_topology().nodes) {
      cpus.insert(cpus.end(), node.cpus.begin(), node.cpus.end());
    }
    int threads = 0;
    if (const char* env = std::getenv("TILEMOE_THREADS"); env != nullptr && *env != '\0') {
      const char* end = env + std::strlen(env);
      const auto [ptr, ec] = std::from_chars(env, end, threads);
      if (ec != std::errc() || ptr != end || threads < 1) {
        fail(ErrorKind::invalid_argument,
             std::string("TILEMOE_THREADS=") + env + ": expected a positive number of threads");
      }
    }
    // Leaked on purpose: see the header.
    return new ThreadPool(threads, std::move(cpus));
  }();
  return *pool;
}

}  // namespace tilemoe::numa
