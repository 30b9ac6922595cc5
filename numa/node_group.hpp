#pragma once
// One worker pool per NUMA node (real or virtual), and a way to run one job on every node at
// once: the tensor-parallel layer gives each node its slice of every expert, and each node's
// workers stream only their own node's memory.
#include <functional>
#include <memory>
#include <vector>

#include "numa/thread_pool.hpp"
#include "numa/topology.hpp"

namespace tilemoe::numa {

class NodeGroup {
 public:
  // `nodes` groups of the machine's cores (partition_nodes: the real nodes when the count
  // matches, else virtual ones), `threads` workers in all (0: one per core) shared out in
  // proportion to the groups' cores, at least one each. More nodes than cores is allowed, so
  // that the split is exercised on small machines: each node then has one unpinned worker.
  // Throws Error(invalid_argument) for nodes < 1 or nodes > 1024.
  NodeGroup(const Topology& topo, int nodes, int threads);
  // One node around an existing pool (not owned), whose memory is on os node `os_node`.
  NodeGroup(ThreadPool& pool, int os_node);
  ~NodeGroup();

  NodeGroup(const NodeGroup&) = delete;
  NodeGroup& operator=(const NodeGroup&) = delete;

  int size() const { return static_cast<int>(pools_.size()); }
  int os_node(int node) const { return os_nodes_[static_cast<std::size_t>(node)]; }
  ThreadPool& pool(int node) const { return *pools_[static_cast<std::size_t>(node)]; }
  int threads() const;

  // Runs fn(node) for every node concurrently, each from a thread that then drives that node's
  // pool (pool(node).parallel_for inside fn is the intended use). Returns when all are done. If
  // some throw, the exception of the lowest such node is rethrown after every node has stopped.
  // With one node fn runs on the calling thread. Not re-entrant. Nodes on one memory node lend
  // each other their idle workers: once fn(node) has returned, node's helpers join the other
  // nodes' parallel_for jobs opened with ThreadPool::Guests::welcome until all have returned.
  void run_on_nodes(const std::function<void(int node)>& fn);

  // Parks every pool of the group (ThreadPool::park): its idle workers sleep instead of polling,
  // for a caller about to run another thread group on the same cores.
  void park() noexcept;

 private:
  std::vector<int> os_nodes_;
  std::vector<std::unique_ptr<ThreadPool>> owned_;
  std::vector<ThreadPool*> pools_;
  std::unique_ptr<ThreadPool> dispatch_;  // one worker per node; null with one node
  std::vector<char> lends_;               // per node: linked to other nodes of its memory node
};

}  // namespace tilemoe::numa
