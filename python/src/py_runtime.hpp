#pragma once
// tilemoe.Runtime: a tilemoe::Runtime (worker threads, ISA, ordered task queue) plus the Python
// objects that queued tasks read or write. Those must outlive their task even when the caller
// drops every reference, so the runtime holds them until a wait or sync shows the task finished.
// It also records which tickets are known finished and where a reported failure may lie, so a
// layer can tell whether its own queued tasks did what it assumed (py_layer.hpp).
//
// Every method is called with the GIL held; waits release it.
#include <pybind11/pybind11.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tilemoe/runtime.hpp"

namespace tilemoe::binding {

namespace py = pybind11;

class PyRuntime {
 public:
  using Ticket = Runtime::Ticket;

  PyRuntime(const std::string& isa, int threads);
  ~PyRuntime();  // runs what is queued, with the GIL released

  // The runtime shared by every layer made with the same ISA and thread count (one ordered queue,
  // as kt-kernel's CPUInfer), created on first use and freed with its last user.
  static std::shared_ptr<PyRuntime> shared(const std::string& isa, int threads);

  Runtime& runtime() { return *rt_; }

  // A task was queued with this ticket; `refs` stays alive until it is known finished.
  void keep_until_done(Ticket ticket, py::object refs);
  // Every task queued before a synchronous call has finished once the call returns (or throws):
  // take last_ticket() before it and pass it here after.
  Ticket last_ticket() const { return last_ticket_; }
  void finished_through(Ticket ticket);

  void wait(Ticket ticket);
  void sync();

  Ticket done_through() const { return done_through_; }
  // Whether a failure reported by wait or sync may have been this ticket's.
  bool may_have_failed(Ticket ticket) const;

 private:
  std::unique_ptr<Runtime> rt_;
  std::vector<std::pair<Ticket, py::object>> pending_;
  Ticket last_ticket_ = 0;
  Ticket done_through_ = 0;
  std::vector<std::pair<Ticket, Ticket>> failed_ranges_;  // [first, last]: a reported failure lies within
};

}  // namespace tilemoe::binding
