#include "src/layer/forward_workspace.hpp"

#include "src/layer/pool_workspace.hpp"

namespace tilemoe {

std::shared_ptr<ForwardWorkspace> forward_workspace_for(const numa::ThreadPool& pool) {
  std::shared_ptr<ForwardWorkspace> ws = pool_workspace<ForwardWorkspace>(pool);
  std::lock_guard<std::mutex> idle(ws->in_use);
  if (ws->scratch.size() < static_cast<std::size_t>(pool.size())) ws->scratch.resize(static_cast<std::size_t>(pool.size()));
  return ws;
}

}  // namespace tilemoe
