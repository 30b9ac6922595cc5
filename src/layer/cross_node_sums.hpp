#pragma once
// The LoRA gradients of a tensor-parallel layer that are sums over its nodes, reduced where
// they are small. Each node holds a slice of the intermediate dimension, so
//
//   gate's and up's A:  dA = dPᵀ x        with dP = s dG B = sum over nodes of s dG_n B_n
//   down's B:           dB = dYᵀ u        with u  = s h Aᵀ = sum over nodes of s h_n A_nᵀ
//
// dP and u are [rows][rank] (a few hundred KB at 512 tokens), the gradients [E][rank][hidden]
// (8 MB each at DeepSeek-V2-Lite's size). Summing the gradients meant that every node computed
// the whole outer product, nodes other than 0 into buffers of their own that were zeroed first,
// and a merge then read and added 24 MB. Here each node publishes its partial dP and u, and each
// block of these gradients is computed once, from the summed partials, straight into the
// caller's arrays, by whichever node's worker claims it.
//
// The partials are summed in node order, and a block's result does not depend on who computes
// it: for a given node count the gradients are the same bits whatever the threads per node.
//
// A node waits only for the other nodes to publish, which each does after its own lora_grads
// phase, before anything that waits: no order of the nodes' work can deadlock. A node that fails
// first calls fail(), and the waiters stop (Stopped); the layer rethrows the node's own error.
#include <atomic>
#include <cstddef>
#include <exception>
#include <vector>

#include "src/layer/first_error.hpp"

namespace tilemoe {

class CrossNodeSums {
 public:
  struct Stopped {};

  // One node's partials, [rows][rank] in TokenGroups order (the same for every node): dP of gate
  // and of up (its backward's), and u of down (its saved forward's). Null for one not summed.
  struct Partials {
    const float* dp_gate = nullptr;
    const float* dp_up = nullptr;
    const float* u_down = nullptr;
    const float* of(int projection) const { return projection == 0 ? dp_gate : projection == 1 ? dp_up : u_down; }
  };

  // Before the nodes start, on one thread: a call over `nodes` nodes, none published.
  void prepare(int nodes);
  int nodes() const { return static_cast<int>(partials_.size()); }

  // Node `node`'s partials, readable by every node from now until the layer's call returns
  // (release).
  void publish(int node, const Partials& p);

  // dst[i][j] = sum over nodes, in node order, of partial `projection` (0 gate, 1 up, 2 down) at
  // row row0 + i, column j < rank (rows `rank` floats apart). Waits until every node has
  // published; throws Stopped after fail().
  void sum_rows(int projection, std::size_t row0, int rows, int rank, float* dst) const;

  // The next unclaimed block of this call's gradient blocks (every node lists the same blocks).
  std::size_t claim_block() { return next_block_.fetch_add(1, std::memory_order_relaxed); }

  // A node will not publish (it failed with `error`): every waiter stops. The first error is
  // kept for the layer to rethrow.
  void fail(std::exception_ptr error) noexcept { error_.fail(error); }
  std::exception_ptr error() const { return error_.error(); }

 private:
  std::vector<Partials> partials_;
  int unpublished_ = 0;  // atomic_ref
  std::atomic<std::size_t> next_block_{0};
  FirstError error_;
};

}  // namespace tilemoe
