#pragma once
// The large transient buffers of a backward, one set per thread pool (pool_workspace.hpp): the
// per-row output gradients, dG|dU, x copies for the LoRA gradients, per-slot grad_input rows
// and split-K partials. At 4096 tokens of DeepSeek-V2-Lite they are about 0.5 GB (dY 100 MB,
// dG|dU 138, x 100, per-slot dX 50); kept per layer, that was about 16 GB for the 26 layers a
// trainer runs backward through.
#include <array>
#include <mutex>
#include <vector>

#include "amx/aligned_vector.hpp"
#include "src/layer/pool_workspace.hpp"
#include "tilemoe/bf16.hpp"

namespace tilemoe {

struct BackwardWorkspace {
  struct Worker {
    AlignedVector<float> c, proj;
    AlignedVector<bf16> transposed;
    AlignedVector<bf16> h;  // an item's h, for down's dA
  };
  std::mutex in_use;
  // Grown to the largest batch seen, never shrunk.
  // Cache-line aligned: tile rows are read and written here.
  AlignedVector<bf16> dy, dgu, dx;
  std::array<AlignedVector<float>, 3> dp;  // s·dOut·B per projection, [rows][rank]
  AlignedVector<float> partials;           // split-K partial products (decode)
  std::vector<Worker> scratch;           // per worker of the pool
};

}  // namespace tilemoe
