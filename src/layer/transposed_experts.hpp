#pragma once
// An optional second copy of a layer's bf16 expert weights, packed as Wᵀ, for the backward's
// products with W (dH = dY Wd, dX = dG Wg + dU Wu): what the backward's items otherwise repack
// from the forward layout, 32 columns at a time, on every call (kernels::pack_transposed_kblock).
// It doubles the weight memory (as kt-kernel's SFT layer always does) and takes the repack off
// the backward's critical path; a trainer with the memory to spare asks for it
// (MoeLayerConfig::backward_weight_copy).
//
// Per expert, exactly the buffers the backward's items build (moe_backward.cpp), for every column:
//   down:    Wdᵀ, 2 * down.kblocks panels of transposed_kblocks(down.panels) k-blocks;
//   gate_up: [Wg ; Wu]ᵀ, 2 * gate_up.kblocks panels, each Wgᵀ's k-blocks then Wuᵀ's.
// so an item reads its panels [p0, p1) at panel p0 and the results are bit-identical either way.
#include <cstddef>

#include "amx/kernel_table.hpp"
#include "numa/node_memory.hpp"
#include "numa/thread_pool.hpp"
#include "src/layer/packed_experts.hpp"

namespace tilemoe {

class TransposedExpertWeights {
 public:
  TransposedExpertWeights() = default;
  // Built in parallel on `pool` into memory of NUMA node `node`, with the table's repack kernel.
  // bf16 weights only: Error(unsupported) for int8/int4 (a bf16 copy would undo what quantizing
  // saved).
  static TransposedExpertWeights build(const PackedExpertWeights& w, const kernels::KernelTable& kt, numa::ThreadPool& pool, int node);

  bool empty() const { return down_.size() == 0; }
  // Wdᵀ panels of expert e; panel q starts down_panel_stride() elements after panel q-1.
  const bf16* down(int e) const { return down_.data() + static_cast<std::size_t>(e) * down_expert_; }
  std::size_t down_panel_stride() const { return down_stride_; }
  const bf16* gate_up(int e) const { return gate_up_.data() + static_cast<std::size_t>(e) * gate_up_expert_; }
  std::size_t gate_up_panel_stride() const { return gate_up_stride_; }
  std::size_t bytes() const { return (down_.size() + gate_up_.size()) * sizeof(bf16); }

 private:
  std::size_t down_stride_ = 0, down_expert_ = 0, gate_up_stride_ = 0, gate_up_expert_ = 0;
  numa::NodeBuffer<bf16> down_, gate_up_;
};

}  // namespace tilemoe
