#include "numa/node_group.hpp"

#include <algorithm>
#include <atomic>
#include <exception>
#include <string>
#include <thread>

#include "tilemoe/error.hpp"

namespace tilemoe::numa {

NodeGroup::NodeGroup(const Topology& topo, int nodes, int threads) {
  if (nodes < 1 || nodes > 1024)
    fail(ErrorKind::invalid_argument, "NUMA nodes: " + std::to_string(nodes) + " must be in [1, 1024]");
  const int cores = std::max(1, topo.cores);
  const int total = threads > 0 ? threads : cores;
  std::vector<NumaNodeInfo> parts;
  if (nodes <= topo.cores) {
    parts = partition_nodes(topo, nodes);
  } else {
    // More nodes than cores: only to test the split; one unpinned worker each, memory of node 0.
    parts.assign(static_cast<std::size_t>(nodes), NumaNodeInfo{topo.nodes.empty() ? 0 : topo.nodes[0].os_index, {}, 0});
  }
  // Threads in proportion to each part's cores (equal shares for core-less parts), at least one.
  std::vector<int> share(parts.size(), 1);
  if (nodes <= topo.cores) {
    int given = 0;
    for (std::size_t n = 0; n < parts.size(); ++n) {
      share[n] = std::max(1, static_cast<int>(static_cast<long long>(total) * static_cast<long long>(parts[n].cpus.size()) / cores));
      given += share[n];
    }
    for (std::size_t n = 0; given < total; n = (n + 1) % parts.size(), ++given) ++share[n];
  }
  std::vector<int> first_cpus;
  for (std::size_t n = 0; n < parts.size(); ++n) {
    os_nodes_.push_back(parts[n].os_index);
    owned_.push_back(std::make_unique<ThreadPool>(share[n], parts[n].cpus));
    pools_.push_back(owned_.back().get());
    if (!parts[n].cpus.empty()) first_cpus.push_back(parts[n].cpus[0]);
  }
  if (first_cpus.size() != parts.size()) first_cpus.clear();  // pin all dispatchers or none
  if (nodes > 1) dispatch_ = std::make_unique<ThreadPool>(nodes, first_cpus);
  // Virtual nodes of one memory node lend each other their idle workers (ThreadPool::link_siblings):
  // the slower half of the cores no longer sets the layer's end alone. Nodes with memory of their
  // own do not: a guest there would stream another node's memory.
  std::vector<char> grouped(pools_.size(), 0);
  lends_.assign(pools_.size(), 0);
  for (std::size_t n = 0; n < pools_.size(); ++n) {
    if (grouped[n]) continue;
    std::vector<std::size_t> same;
    for (std::size_t m = n; m < pools_.size(); ++m)
      if (os_nodes_[m] == os_nodes_[n]) same.push_back(m), grouped[m] = 1;
    if (same.size() < 2) continue;
    std::vector<ThreadPool*> pools;
    for (std::size_t m : same) pools.push_back(pools_[m]), lends_[m] = 1;
    ThreadPool::link_siblings(pools);
  }
}

NodeGroup::NodeGroup(ThreadPool& pool, int os_node) : os_nodes_{os_node}, pools_{&pool} {}

NodeGroup::~NodeGroup() = default;

int NodeGroup::threads() const {
  int t = 0;
  for (const ThreadPool* p : pools_) t += p->size();
  return t;
}

void NodeGroup::park() noexcept {
  for (ThreadPool* p : pools_) p->park();
  if (dispatch_) dispatch_->park();
}

void NodeGroup::run_on_nodes(const std::function<void(int node)>& fn) {
  const int n = size();
  if (n == 1) return fn(0);
  std::vector<std::atomic<bool>> claimed(static_cast<std::size_t>(n));
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(n));
  // A node that is done lends its idle workers to the others still at it (pools of one memory
  // node are linked: ThreadPool::link_siblings), its dispatcher too, until the last one is done:
  // a dispatcher that waited instead had cores idle, and the last node's end then reached the
  // caller a futex wake-up later.
  std::atomic<int> running{n};
  struct StopLending {
    const std::vector<ThreadPool*>& pools;
    ~StopLending() {
      for (ThreadPool* p : pools) p->lend_idle_helpers(false);
    }
  } stop_lending{pools_};
  // Dispatcher `worker` sits on node `worker`'s first core: it takes that node when it can.
  dispatch_->parallel_for(static_cast<std::size_t>(n), [&](std::size_t, int worker) {
    int node = worker < n && !claimed[static_cast<std::size_t>(worker)].exchange(true) ? worker : -1;
    for (int i = 0; node < 0 && i < n; ++i)
      if (!claimed[static_cast<std::size_t>(i)].exchange(true)) node = i;
    if (node < 0) return;  // cannot happen: one claim per item and n items
    try {
      fn(node);
    } catch (...) {
      errors[static_cast<std::size_t>(node)] = std::current_exception();
    }
    running.fetch_sub(1, std::memory_order_acq_rel);
    if (!lends_[static_cast<std::size_t>(node)]) return;  // memory of its own: nothing to lend
    ThreadPool& mine = *pools_[static_cast<std::size_t>(node)];
    mine.lend_idle_helpers(true);
    std::vector<std::uint32_t> exhausted;
    while (running.load(std::memory_order_acquire) > 0)
      if (!mine.help_siblings_now(exhausted)) std::this_thread::yield();
  });
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace tilemoe::numa
