#pragma once
// The large transient buffers of a forward (gathered x, h, their int8 codes, the per-slot output
// rows, per-worker scratch), shared by every layer that runs on one pool. Layers run one at a
// time on a pool (each parallel_for takes all its workers), so one set serves them all: a model
// of 26-60 MoE layers holds one set per pool instead of one per layer. At 4096 tokens of
// DeepSeek-V2-Lite that is about 0.4 GB instead of 0.4 GB a layer, and each layer's first large
// batch no longer pays for faulting in its own set (~250 ms on the device).
//
// A forward holds `in_use` from its first write to its last read, so that two threads running
// layers on the same pool take turns instead of sharing the buffers.
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "numa/thread_pool.hpp"
#include "tilemoe/bf16.hpp"

namespace tilemoe {

struct ForwardWorkspace {
  std::mutex in_use;
  // Grown to the largest batch seen, never shrunk.
  std::vector<bf16> xs, h;
  std::vector<std::int8_t> xq, hq;
  std::vector<float> y;
  std::vector<std::vector<float>> scratch;  // per worker of the pool
};

// The workspace of `pool`: the same one for every caller while any of them holds it, freed with
// the last holder.
std::shared_ptr<ForwardWorkspace> forward_workspace_for(const numa::ThreadPool& pool);

}  // namespace tilemoe
