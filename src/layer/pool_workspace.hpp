#pragma once
// One set of transient buffers per thread pool and kind, shared by every layer on that pool.
// Layers run one at a time on a pool (each parallel_for takes all its workers), so a model of
// 26-60 MoE layers needs one set per pool, not one per layer. The set lives while any layer holds
// it; a call locks its `in_use` mutex from its first write to its last read, so that two threads
// running layers on one pool take turns instead of sharing the buffers.
#include <cstddef>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>

#include "amx/aligned_vector.hpp"
#include "numa/thread_pool.hpp"

namespace tilemoe {

// The Workspace of `pool` (default-constructed the first time; Workspace has a std::mutex named
// in_use, and may have a vector `scratch` with one entry per worker slot, sized here): the same object
// for every caller while any of them holds it.
template <typename Workspace>
std::shared_ptr<Workspace> pool_workspace(const numa::ThreadPool& pool) {
  static std::mutex registry_mutex;
  static std::map<const numa::ThreadPool*, std::weak_ptr<Workspace>> registry;
  std::lock_guard<std::mutex> lock(registry_mutex);
  // Entries of pools whose layers are all gone are dropped as we pass.
  for (auto it = registry.begin(); it != registry.end();) it = it->second.expired() ? registry.erase(it) : std::next(it);
  std::weak_ptr<Workspace>& slot = registry[&pool];
  std::shared_ptr<Workspace> ws = slot.lock();
  if (!ws) {
    ws = std::make_shared<Workspace>();
    slot = ws;
  }
  std::lock_guard<std::mutex> idle(ws->in_use);
  if constexpr (requires { ws->scratch; })
    grow_to(ws->scratch, static_cast<std::size_t>(pool.worker_slots()));
  return ws;
}

}  // namespace tilemoe
