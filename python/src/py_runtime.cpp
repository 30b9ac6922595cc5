#include "py_runtime.hpp"

#include <algorithm>
#include <map>

namespace tilemoe::binding {

PyRuntime::PyRuntime(const std::string& isa, int threads) {
  py::gil_scoped_release release;
  rt_ = std::make_unique<Runtime>(RuntimeOptions{isa, threads});
}

PyRuntime::~PyRuntime() {
  {
    py::gil_scoped_release release;
    rt_.reset();
  }
  pending_.clear();  // with the GIL, after the tasks that used these objects have run
}

std::shared_ptr<PyRuntime> PyRuntime::shared(const std::string& isa, int threads) {
  // Weak: the runtime goes away with its last layer. Never destroyed itself: Python may be gone
  // by the time static destructors run.
  static auto* cache = new std::map<std::pair<std::string, int>, std::weak_ptr<PyRuntime>>();
  auto& slot = (*cache)[{isa, threads}];
  if (auto rt = slot.lock()) return rt;
  auto rt = std::make_shared<PyRuntime>(isa, threads);
  slot = rt;
  return rt;
}

void PyRuntime::keep_until_done(Ticket ticket, py::object refs) {
  pending_.emplace_back(ticket, std::move(refs));
  last_ticket_ = std::max(last_ticket_, ticket);
}

void PyRuntime::finished_through(Ticket ticket) {
  done_through_ = std::max(done_through_, ticket);
  pending_.erase(std::remove_if(pending_.begin(), pending_.end(), [&](const auto& p) { return p.first <= ticket; }),
                 pending_.end());
}

void PyRuntime::wait(Ticket ticket) {
  try {
    py::gil_scoped_release release;
    rt_->wait(ticket);
  } catch (...) {
    failed_ranges_.emplace_back(ticket, ticket);
    finished_through(ticket);
    throw;
  }
  finished_through(ticket);
}

void PyRuntime::sync() {
  const Ticket before = last_ticket_;
  try {
    py::gil_scoped_release release;
    rt_->sync();
  } catch (...) {
    failed_ranges_.emplace_back(1, before);  // sync does not say whose failure it reports
    finished_through(before);
    throw;
  }
  finished_through(before);
}

bool PyRuntime::may_have_failed(Ticket ticket) const {
  for (const auto& [first, last] : failed_ranges_)
    if (ticket >= first && ticket <= last) return true;
  return false;
}

}  // namespace tilemoe::binding
