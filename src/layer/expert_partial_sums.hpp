#pragma once
// Down's LoRA term in the forward of a tensor-parallel layer, applied once per expert instead of
// once per node. Each node holds a slice of the intermediate dimension, so
//
//   u = s h A_downᵀ = sum over nodes of s h_n A_nᵀ        ([rows][rank] per expert)
//
// and y = h Wdᵀ + u B_downᵀ, where B_down covers every output column. Each node's down items
// write a partial y over every column; when each also added u_n B_downᵀ, every node packed all of
// B_down's panels and ran its extra K steps, N times the work of one node. Here each node
// publishes its u_n per expert, and one node (the expert's owner) adds the sum's term.
//
// The partials are summed in node order by the owner: for a given node count the output is the
// same bits whatever the threads per node. A node publishes an expert's partial in its gate_up
// phase, which waits only for work that other nodes have claimed and do without waiting; the
// owner reads the sum in its down phase. No order of the nodes' work can deadlock. A node that
// fails calls fail(), and the waiters stop (Stopped); the layer rethrows the first error.
#include <cstddef>
#include <exception>
#include <vector>

#include "src/layer/first_error.hpp"

namespace tilemoe {

class ExpertPartialSums {
 public:
  struct Stopped {};

  // Before the nodes start, on one thread: a call over `nodes` nodes and `experts` experts, none
  // published.
  void prepare(int nodes, int experts);
  int nodes() const { return static_cast<int>(rows_.size()); }
  // The node that adds expert e's summed term.
  int owner(int e) const { return e % nodes(); }

  // Node `node`'s partial rows, [rows][ld] floats in TokenGroups order (the same for every
  // node); set before the node's first publish.
  void set_rows(int node, const float* rows, std::size_t ld);
  // The calling node's rows of expert e are written (release). Each node publishes each expert
  // that has the term once.
  void publish(int e);
  // dst[i][j] = sum over nodes, in node order, of row row0 + i, column j < cols. Waits until every
  // node has published expert e; throws Stopped after fail().
  void sum(int e, std::size_t row0, int rows, int cols, float* dst, std::size_t ld_dst) const;

  // A node will not publish (it failed with `error`): every waiter stops. The first error is kept
  // for the layer to rethrow.
  void fail(std::exception_ptr error) noexcept { error_.fail(error); }
  std::exception_ptr error() const { return error_.error(); }

 private:
  std::vector<const float*> rows_;
  std::vector<std::size_t> ld_;
  std::vector<int> unpublished_;  // per expert: nodes yet to publish (atomic_ref)
  FirstError error_;
};

}  // namespace tilemoe
