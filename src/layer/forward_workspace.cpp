#include "src/layer/forward_workspace.hpp"

#include <iterator>
#include <map>

namespace tilemoe {

std::shared_ptr<ForwardWorkspace> forward_workspace_for(const numa::ThreadPool& pool) {
  static std::mutex registry_mutex;
  static std::map<const numa::ThreadPool*, std::weak_ptr<ForwardWorkspace>> registry;
  std::lock_guard<std::mutex> lock(registry_mutex);
  // Entries of pools whose layers are all gone are dropped as we pass.
  for (auto it = registry.begin(); it != registry.end();) it = it->second.expired() ? registry.erase(it) : std::next(it);
  std::weak_ptr<ForwardWorkspace>& slot = registry[&pool];
  std::shared_ptr<ForwardWorkspace> ws = slot.lock();
  if (!ws) {
    ws = std::make_shared<ForwardWorkspace>();
    slot = ws;
  }
  if (ws->scratch.size() < static_cast<std::size_t>(pool.size())) {
    std::lock_guard<std::mutex> idle(ws->in_use);
    ws->scratch.resize(static_cast<std::size_t>(pool.size()));
  }
  return ws;
}

}  // namespace tilemoe
