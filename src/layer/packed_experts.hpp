#pragma once
// A layer's expert weights packed once, at load, into the layout every GEMM kernel reads
// (amx/pack_bf16.hpp): gate and up as [I x H], down as [H x I], per expert, padded to tiles.
#include "amx/pack_bf16.hpp"
#include "numa/node_memory.hpp"
#include "numa/thread_pool.hpp"
#include "src/model/expert_weights.hpp"

namespace tilemoe {

class PackedExpertWeights {
 public:
  PackedExpertWeights() = default;
  // Packs in parallel on `pool`, into memory of NUMA node `node`.
  static PackedExpertWeights pack(const ExpertWeightsView& w, numa::ThreadPool& pool, int node = 0);

  const MoeShape& shape() const { return shape_; }
  const kernels::PackedShape& up_shape() const { return gate_up_; }  // gate and up: n = I, k = H
  const kernels::PackedShape& down_shape() const { return down_shape_; }   // down: n = H, k = I
  const bf16* packed(Projection p, int expert) const;
  std::size_t bytes() const { return (gate_.size() + up_.size() + down_.size()) * sizeof(bf16); }
  std::size_t bytes_per_expert() const { return bytes() / static_cast<std::size_t>(shape_.num_experts); }

 private:
  MoeShape shape_;
  kernels::PackedShape gate_up_{}, down_shape_{};
  numa::NodeBuffer<bf16> gate_, up_, down_;
};

}  // namespace tilemoe
