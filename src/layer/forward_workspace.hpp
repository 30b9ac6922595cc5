#pragma once
// The large transient buffers of a forward (gathered x, h, their int8 codes, the per-slot output
// rows, per-worker scratch), one set per thread pool (pool_workspace.hpp). At 4096 tokens of
// DeepSeek-V2-Lite that is about 0.4 GB for the whole model instead of 0.4 GB a layer, and each
// layer's first large batch no longer pays for faulting in its own set (~250 ms on the device).
#include <cstdint>
#include <mutex>
#include <vector>

#include "amx/aligned_vector.hpp"
#include "src/layer/pool_workspace.hpp"
#include "src/layer/token_codes.hpp"
#include "tilemoe/bf16.hpp"

namespace tilemoe {

struct ForwardWorkspace {
  std::mutex in_use;
  // Grown to the largest batch seen, never shrunk.
  // Cache-line aligned: tile rows are read and written here.
  AlignedVector<bf16> xs, h;
  AlignedVector<std::int8_t> xq, hq;
  TokenCodes token_codes;  // integer weights: each token's codes of x, quantized once a call
  AlignedVector<bf16> y;  // the down outputs, one row per routed row
  std::vector<AlignedVector<float>> scratch;  // per worker of the pool
};

}  // namespace tilemoe
