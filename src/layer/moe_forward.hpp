#pragma once
// The fast forward of one MoE layer on one node: packed weights, the kernel table of one ISA,
// and the pool's workers. Work is split into items whose boundaries depend on the routing only,
// never on the thread count, so the output is bit-identical for any number of threads.
//
// Phases (gate_up and down one parallel_for, down's items after gate_up's, each expert's waiting
// for its h; then the combine):
//   gate_up    items (expert, column chunk): gate and up GEMMs with LoRA B fused as extra K
//              steps (integer weights: the integer GEMM, then the LoRA term added to it), then
//              h = silu(gate) * up in bf16; the item that completes an expert's h then computes
//              s * h A_down^T (and, for integer weights, h quantized per row). Ahead of each
//              expert's items, its prep items, which they wait for (item_countdowns.hpp) while the
//              other cores stream weights, instead of phases of their own:
//              - gather units: up to 16 x rows of (token, slot) pairs into one bf16 block grouped
//                by expert (for int8/int4 weights, into int8 codes per row instead). Experts that
//                run on AMX tiles get their rows of x (and later of h) in tile order
//                (pack_bf16.hpp), so that every A tile load is one contiguous 1 KiB.
//              - the LoRA's s * x A^T for gate and up: from the caller's x rows for experts with
//                few rows, which read the f32 factors as they are; for the others, the factors
//                packed for the kernels, and x A^T from the gathered x (integer weights: from
//                the caller's rows, a block at a time) computed by whichever of the expert's
//                gather units and packings ends last.
//   down       items (expert, column chunk): y = h Wd^T (+ LoRA) into the worker's scratch, then
//              as bf16 into one row per routed row in TokenGroups order; few-row experts' s * h
//              A_down^T are items ahead of theirs
//   combine    out[t] = sum_j w[t,j] y[groups.row_of_slot[(t,j)]], slots in order
#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "amx/isa.hpp"
#include "amx/kernel_table.hpp"
#include "numa/thread_pool.hpp"
#include "src/layer/expert_partial_sums.hpp"
#include "src/layer/forward_workspace.hpp"
#include "src/layer/item_countdowns.hpp"
#include "src/layer/lora_term.hpp"
#include "src/layer/packed_experts.hpp"
#include "src/layer/shared_gather.hpp"
#include "src/lora/lora_view.hpp"
#include "src/routing/token_groups.hpp"

namespace tilemoe {

// Where a forward leaves what backward needs (the cache entry's memory), rows grouped by expert
// in TokenGroups order: gate and up before the activation, and s·v·Aᵀ of every projection with
// LoRA (row stride: that projection's rank).
struct ForwardSave {
  bf16* gate = nullptr;  // [rows][intermediate]
  bf16* up = nullptr;    // [rows][intermediate]
  std::array<float*, 3> xa{};
};

// The forward's share of a tensor-parallel layer's cross-node work; a layer of one node passes
// none of it.
struct ForwardNodes {
  // Nodes on one memory node: the gathered rows of x, each gathered once by whichever node claims
  // it (shared_gather.hpp); a node that stops because another failed throws SharedGather::Stopped.
  SharedGather* gather = nullptr;
  // Several nodes: down's LoRA term of experts in the packed form is added by one node, the
  // expert's owner, from every node's s h A_downᵀ (expert_partial_sums.hpp). This node is `node`.
  ExpertPartialSums* down_lora = nullptr;
  int node = 0;
};

class MoeForward {
 public:
  MoeForward(const PackedExpertWeights& weights, kernels::Isa isa, numa::ThreadPool& pool);

  // x: bf16 [T][H]; expert_ids, weights: [T][k]; out: f32 [T][H], overwritten. Ids are checked
  // before anything is written; the LoRA factors are read in place. `nodes` (prepared for this
  // call's routing): see ForwardNodes.
  void forward(const LayerLoraView& lora, int tokens, int top_k, const bf16* x, const std::int64_t* expert_ids,
               const float* weights, float* out, const ForwardSave* save = nullptr, const ForwardNodes& nodes = {});
  void forward(const LayerLora& lora, int tokens, int top_k, const bf16* x, const std::int64_t* expert_ids, const float* weights,
               float* out) {
    forward(lora_view(lora), tokens, top_k, x, expert_ids, weights, out);
  }

  kernels::Isa isa() const { return isa_; }

  // The LoRA sets of the next calls are held by the layer under this number (a loaded adapter,
  // which nothing changes while it is in use): an expert's factors are packed for the tile
  // kernels once and reused, with the same results. 0: the caller's arrays, packed at every
  // call (for experts that take the packed form) because the caller may write them in place.
  void set_lora_held(std::uint64_t generation) { lora_held_generation_ = generation; }
  WeightType weight_type() const { return w_.weight_type(); }

  // Rows from which an expert's x and h (bf16, or their int8 codes for integer weights) are held
  // in tile order. By default the AMX table's threshold where the tile kernels run, and never on
  // other ISAs, where it gains nothing; every kernel reads both layouts, so tests force it on any
  // ISA. 0: never; -1: default.
  void set_tile_order_min_rows(int rows) { tile_order_override_ = rows; }

  // Seconds spent in each phase since construction (gate_up, down, combine): what the bench's
  // --phases prints to show where time goes. gate_up ends with its last item, down with the last
  // down item (the two overlap: down's first items run while gate_up's last ones do).
  static constexpr int kPhases = 3;
  static const char* phase_name(int i);
  const std::array<double, kPhases>& phase_seconds() const { return phase_seconds_; }
  void reset_phase_seconds() { phase_seconds_ = {}; }

 private:
  // One expert's rows of xs_ or h_ (row length ld): by rows, or in tile order.
  struct ExpertRows {
    bf16* p;
    std::size_t ld;
    bool tiles;
  };
  ExpertRows expert_rows(bf16* block, int e, std::size_t ld) { return {block + block_row_[e] * ld, ld, tiled_[e] != 0}; }
  ExpertRows expert_rows(AlignedVector<bf16>& block, int e, std::size_t ld) { return expert_rows(block.data(), e, ld); }
  // C = A Wᵀ (+ LoRA term) for expert e's m rows over panels [p0, p1); `a` is its bf16 rows of
  // x or h, whose quantized twin (rows from row0, TokenGroups order) integer weights read. A term
  // in the f32 form is added after the product; with `ready`, once its counter ready_counter is
  // zero (another item computes its x Aᵀ or h A_downᵀ), waited for from slot `ready_slot` of its
  // parallel_for. A packed term must be ready before the call.
  // With y (integer weights), the result may go to y's rows (ldy apart) as bf16 instead of c, where
  // the kernel can write it so (gemm_int.hpp): true if it did.
  bool project_columns(Projection p, int e, int m, std::size_t row0, int p0, int p1, ExpertRows a, const LoraTerm* term, float* c,
                       std::size_t ldc, int n, ItemCountdowns* ready = nullptr, std::size_t ready_counter = 0, std::size_t ready_slot = 0,
                       bf16* y = nullptr, std::size_t ldy = 0);
  void quantize_rows(const bf16* src, std::size_t ld, int rows, Projection p, std::int8_t* codes, float* scales);
  // The same into rows [row0, row0 + rows) of codes held in tile order.
  void quantize_rows_as_tiles(const bf16* src, std::size_t ld, int row0, int rows, Projection p, std::int8_t* tiles, float* scales);

  const PackedExpertWeights& w_;
  kernels::Isa isa_;
  const kernels::KernelTable& kt_;
  numa::ThreadPool& pool_;

  // The pool's shared buffers (forward_workspace.hpp), under their names here.
  std::shared_ptr<ForwardWorkspace> ws_;
  AlignedVector<bf16>& xs_ = ws_->xs;
  AlignedVector<bf16>& h_ = ws_->h;
  // Where each expert's rows start in xs_ and h_ (in rows of the block), and whether they are
  // in tile order (then rounded up to whole row tiles).
  std::vector<std::size_t> block_row_;
  std::vector<char> tiled_;
  int tile_order_override_ = -1;
  std::uint64_t lora_held_generation_ = 0;
  // Integer weights: x and h quantized per row (codes at the int layouts' k_padded stride), each
  // expert's from qblock_row_[e] on; in tile order (pack_int.hpp) where qtiled_[e], whole row
  // tiles then. Scales stay in TokenGroups order.
  AlignedVector<std::int8_t>& xq_ = ws_->xq;
  AlignedVector<std::int8_t>& hq_ = ws_->hq;
  std::vector<std::size_t> qblock_row_;
  std::vector<char> qtiled_;
  std::vector<float> xq_scale_, hq_scale_;
  // This call's x codes and their scales: xq_ and xq_scale_, or a SharedGather's.
  std::int8_t* xq_data_ = nullptr;
  float* xq_scale_data_ = nullptr;
  AlignedVector<bf16>& y_ = ws_->y;
  std::vector<int> active_;
  std::vector<int> h_items_left_;  // per expert: gate_up items not yet done (atomic_ref)
  // per expert of the packed LoRA form: gather units and factor packings not yet done (atomic_ref);
  // the prep item that ends them computes the expert's x Aᵀ of gate and up
  std::vector<int> xa_inputs_left_;
  // gate_up's prep items: (expert, projection) of a LoRA's, (expert, -1 - first row) of a gather unit
  std::vector<std::array<int, 2>> prep_;
  // down's prep items: (expert, down) of experts whose down LoRA has the f32 form; (expert, -1) of
  // experts whose summed term this node adds (ForwardNodes::down_lora)
  std::vector<std::array<int, 2>> down_prep_;
  AlignedVector<float> down_partial_;  // this node's s h A_downᵀ for the other nodes, when not saved
  ItemCountdowns ready_;  // per expert: prep items not yet done (gate_up: and gather units alone)
  std::vector<std::array<LoraTerm, 3>> lora_;
  std::vector<AlignedVector<float>>& scratch_ = ws_->scratch;  // per worker
  std::array<double, kPhases> phase_seconds_{};
};

}  // namespace tilemoe
