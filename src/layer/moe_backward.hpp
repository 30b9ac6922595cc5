#pragma once
// The fast backward of one MoE layer on one node, from a forward cache entry:
//
//   dY = w * dO (per routing slot)        dP_d = s dY Bd          dH = dY Wd + dP_d Ad
//   dG, dU = silu_mul_backward(dH; G, U)  dP_g = s dG Bg (up alike) dX = dG Wg + dU Wu + dP_g Ag + dP_u Au
//   grad_input[t] = sum over the token's slots of dX
//   dB_p = dOut_pᵀ (s In_p A_pᵀ)   dA_p = dP_pᵀ In_p      (In/Out: x/gate|up, h/down)
//
// The products with W (not Wᵀ) read the forward's packed weights: each item repacks the 32
// columns it needs into a per-worker buffer (kernels::pack_transposed_kblock) and runs the
// ordinary tile kernels on it, so backward costs no second copy of the weights; or, given a
// TransposedExpertWeights, the items read Wᵀ from it (twice the weight memory, no repack). The LoRA terms
// are the forward's LoraTerm with transposed factors. Items depend on the routing only, so the
// results are bit-identical for any thread count.
//
// Phases: gather, lora_prep, dh (with the SwiGLU backward, and the LoRA gradients of gate's and
// up's B and down's A, column by column), lora_grads (dP and dA of gate and up), dx, lora_sums
// (tensor parallel: the LoRA gradients summed over the nodes), combine. The first five share one
// parallel_for: an expert's dh items wait for its gather units and prepared terms, its lora_grads
// items for its dh items, its dx items for its lora_grads (ItemCountdowns), so no core waits at
// their ends. (Overwritten gradients that no item writes are zeroed by a parallel_for before;
// phase_seconds counts that as lora_prep, and the gather and the terms' preparation in dh.)
#include <array>
#include <functional>
#include <memory>
#include <vector>

#include "amx/kernel_table.hpp"
#include "numa/thread_pool.hpp"
#include "src/layer/backward_workspace.hpp"
#include "src/layer/cross_node_sums.hpp"
#include "src/layer/forward_cache.hpp"
#include "src/layer/item_countdowns.hpp"
#include "src/layer/lora_term.hpp"
#include "src/layer/packed_experts.hpp"
#include "src/layer/shared_gather.hpp"
#include "src/layer/transposed_experts.hpp"
#include "src/lora/lora_view.hpp"

namespace tilemoe {

// The nodes of a tensor-parallel layer, as one node's backward sees them.
struct BackwardNodes {
  // Gate's and up's A gradient and down's B gradient are the sums over the nodes
  // (cross_node_sums.hpp): this node publishes its partials, and its workers compute whichever
  // blocks of those gradients they claim; of experts without tokens it zeroes those with
  // e % nodes == node. The other gradients are this node's slices, as on a node of its own.
  // The backward then throws CrossNodeSums::Stopped when another node failed.
  CrossNodeSums* sums = nullptr;
  int node = 0;
  // Nodes on one memory node: the rows of w dO, each copied by one node
  // (SharedGather::prepare_backward, called before the nodes start).
  SharedGather* gather = nullptr;
};

class MoeBackward {
 public:
  MoeBackward(const PackedExpertWeights& weights, kernels::Isa isa, numa::ThreadPool& pool);

  // grad_output, grad_input: f32 [tokens][hidden] of the entry's batch; grad_input is
  // overwritten. LoRA gradients go to `grads` (shaped like entry.lora; null pointers skip one):
  // overwritten (experts without tokens get zero) or, with accumulate, added to what is there.
  void backward(const ForwardCacheEntry& entry, const float* grad_output, float* grad_input, const LayerLoraGrad& grads,
                bool accumulate, const BackwardNodes& nodes = {});

  // Reads Wᵀ from `copy` (built from the same weights) instead of repacking it in every item;
  // the same bits. nullptr (the default): repack. The copy must outlive the backward calls.
  void use_transposed_copy(const TransposedExpertWeights* copy) { copy_ = copy && !copy->empty() ? copy : nullptr; }

  static constexpr int kPhases = 7;
  static const char* phase_name(int i);
  const std::array<double, kPhases>& phase_seconds() const { return phase_seconds_; }
  void reset_phase_seconds() { phase_seconds_ = {}; }

 private:
  std::function<void(int nb0, int nb1, int kb, bf16* dst, std::size_t stride)> transposer(Projection p, int e) const;

  using WorkerScratch = BackwardWorkspace::Worker;

  const PackedExpertWeights& w_;
  const TransposedExpertWeights* copy_ = nullptr;
  const kernels::KernelTable& kt_;
  numa::ThreadPool& pool_;

  // The pool's shared buffers (backward_workspace.hpp), under their names here.
  std::shared_ptr<BackwardWorkspace> ws_;
  AlignedVector<bf16>& dy_ = ws_->dy;
  AlignedVector<bf16>& dgu_ = ws_->dgu;
  AlignedVector<bf16>& dx_ = ws_->dx;
  std::array<AlignedVector<float>, 3>& dp_ = ws_->dp;
  AlignedVector<float>& partials_ = ws_->partials;
  std::vector<WorkerScratch>& scratch_ = ws_->scratch;
  std::vector<int> active_, column_split_, split_k_;
  // The prep items ahead of the dh items: {e, -1 - first row} a gather unit, {e, p} a LoRA term.
  std::vector<std::array<int, 2>> prep_;
  std::vector<std::array<LoraTerm, 3>> terms_;
  ItemCountdowns ready_;  // what the prep, dh, lora_grads and dx items wait for (one parallel_for)
  std::array<double, kPhases> phase_seconds_{};
};

}  // namespace tilemoe
