#pragma once
// The gathered x of one forward, shared by the nodes of a tensor-parallel layer that sit on one
// memory node (virtual nodes): each node needs every routed row of x, and with a gather of its
// own each node copied all of them on its share of the cores. On the device (512 tokens of
// DeepSeek-V2-Lite, 2 virtual nodes) that made each node's gate_up phase 0.8 ms longer than one
// node's.
//
// Every node still runs every gather unit (16 rows of one expert) as an item of its own order;
// the first node to reach a unit claims it and copies it, the others skip it. An item waits only
// for units that are claimed, and a claimed unit is copied by a running worker that waits for
// nothing in between, so no order of the nodes' items can deadlock. Which node copies a unit
// changes nothing in what is copied: the output bits are those of per-node gathers.
//
// The same holds for what the nodes' LoRA terms of gate and up would each compute alike (their A
// is not sliced): A packed, and s x Aᵀ (below); and for the backward's rows of dY = w dO, which
// every node reads whole (prepare_backward).
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <mutex>
#include <vector>

#include "amx/aligned_vector.hpp"
#include "src/layer/first_error.hpp"
#include "src/layer/token_codes.hpp"
#include "src/routing/token_groups.hpp"
#include "tilemoe/bf16.hpp"

namespace tilemoe {

class LoraTerm;

// One per node group (pool_workspace.hpp, keyed by node 0's pool): the layers of a model take
// turns with it, holding `in_use` for a whole forward.
class SharedGather {
 public:
  std::mutex in_use;

  // Rows a unit copies (one A row tile).
  static constexpr int kUnitRows = 16;

  // What a waiting item throws once a node has failed while holding a unit: the node's own
  // error is the one to report.
  struct Stopped {};

  // Before the nodes start, on one thread: this call's units, none claimed, and the buffers
  // grown for `groups` (rows of x: bf16 at x_ld elements, or int8 codes at code_ld bytes with a
  // scale each; 0 for a form not used). Rows of experts held in tile order are padded to whole
  // tiles: the buffers allow for that. `nodes`: the nodes that share the rows (owns()). With
  // codes, token_codes holds `tokens` rows.
  void prepare(const TokenGroups& groups, std::size_t x_ld, std::size_t code_ld, int nodes = 1, int tokens = 0);
  // The same for a backward: units as above, over rows of dY (dy_ld elements).
  void prepare_backward(const TokenGroups& groups, std::size_t dy_ld);

  // Whether the caller copies unit (e, first row `row`): true for exactly one caller a call.
  bool claim(int e, int row);
  // The node that copies unit (e, row) when it reaches it. The forward's nodes claim only their
  // own units as they reach them, and a node that needs an expert's rows first claims and copies
  // whichever of them are still unclaimed (their owner is behind). Claiming every unit reached
  // instead, the node that ran ahead copied nearly all of them: on the device (512 tokens, 2
  // virtual nodes) node 0 ended its forward 1.2-1.6 ms after node 1.
  bool owns(int node, int e, int row) const { return (e + row / kUnitRows) % nodes_ == node; }
  // A claimed unit is written (release: a waiter that sees its expert done sees the rows).
  void done(int e);
  // Returns once every unit of expert e is written; throws Stopped after fail().
  void wait(int e) const;
  // A claimed unit will not be written (its copy threw `error`): every waiter stops. The first
  // error is kept for the layer to rethrow: the nodes that stopped report only Stopped.
  void fail(std::exception_ptr error) noexcept { error_.fail(error); }
  std::exception_ptr error() const { return error_.error(); }

  // Every node's layout of the gathered rows must be the same: the first node's key is kept and
  // another node's differing key is a logic error (thrown before it claims anything).
  void agree_on_layout(std::uint64_t key);

  // The LoRA's s x Aᵀ of gate and up (p = 0, 1) in its packed form, on the caller's arrays: every
  // node needs the same values, made from the same x and A. Each projection's A is packed by the
  // node that claims it, and each expert's x Aᵀ is computed by the node that claims it; the
  // others read them from that node's terms (which stay put until the layer's call returns). As
  // with the rows, a wait is only ever for claimed work, done by a running worker that itself
  // waits only for claimed work (packing waits for nothing; x Aᵀ for packings and rows).
  bool claim_packed_a(int e, int p);
  void publish_packed_a(int e, int p, const LoraTerm* term);  // release
  const LoraTerm& wait_packed_a(int e, int p) const;          // throws Stopped after fail()
  struct Projected {
    const LoraTerm* term[2];
    const float* saved[2];  // the claimer's saved f32 values ([rows][rank]), or null
  };
  bool claim_xa(int e);
  void publish_xa(int e, const Projected& done);
  const Projected& wait_xa(int e) const;

  AlignedVector<bf16> x;           // bf16 rows (bf16 weights)
  AlignedVector<std::int8_t> codes;  // int8 codes (integer weights)
  std::vector<float> code_scales;  // one per routed row, in TokenGroups order
  TokenCodes token_codes;          // each token's codes, quantized once for every node
  AlignedVector<bf16> dy;          // the backward's rows of w dO

 private:
  void reset_units(const TokenGroups& groups);
  int nodes_ = 1;
  std::vector<int> first_unit_;  // [E + 1]
  std::vector<int> claimed_;     // per unit (atomic_ref)
  std::vector<int> left_;        // per expert: units not yet written (atomic_ref)
  std::vector<int> a_claimed_, a_pending_;    // [E][2] (atomic_ref); pending: 1 until published
  std::vector<const LoraTerm*> packed_a_;     // [E][2]
  std::vector<int> xa_claimed_, xa_pending_;  // [E] (atomic_ref)
  std::vector<Projected> xa_;                 // [E]
  void wait_for_zero(const int& flag) const;  // throws Stopped after fail()
  FirstError error_;
  std::atomic<std::uint64_t> layout_{0};
};

}  // namespace tilemoe
