#pragma once
// A layer's expert weights packed once, at load, into the layout the GEMM kernels read, per
// expert, padded to tiles: gate and up as [I x H], down as [H x I]. Either bf16
// (amx/pack_bf16.hpp), int8/int4 codes with their scales (amx/pack_int.hpp), or MXFP4 codes with
// their exponents (amx/pack_mxfp4.hpp).
#include <array>
#include <vector>

#include "amx/pack_bf16.hpp"
#include "amx/gemm_mxfp4.hpp"
#include "amx/pack_int.hpp"
#include "numa/node_memory.hpp"
#include "numa/thread_pool.hpp"
#include "src/model/expert_biases.hpp"
#include "src/model/expert_weights.hpp"
#include "src/quant/numa_slices.hpp"
#include "src/quant/quantize.hpp"

namespace tilemoe {

class PackedExpertWeights {
 public:
  PackedExpertWeights() = default;
  // Packs in parallel on `pool`, into memory of NUMA node `node`.
  static PackedExpertWeights pack(const ExpertWeightsView& w, numa::ThreadPool& pool, int node = 0);
  // The slice [begin, end) of the intermediate dimension (gate/up rows, down columns), read in
  // place, as a layer of intermediate = slice.width(): one NUMA node's share.
  static PackedExpertWeights pack_slice(const ExpertWeightsView& w, quant::IntermediateSlice slice, numa::ThreadPool& pool, int node);
  static PackedExpertWeights pack_quantized(const quant::QuantizedExperts& q, numa::ThreadPool& pool, int node = 0);
  // The slice [s.begin, s.end) of q's intermediate size (quant::slice_experts), with no copy of q
  // when the slice is all of it.
  static PackedExpertWeights pack_quantized_slice(const quant::QuantizedExperts& q, quant::IntermediateSlice s, numa::ThreadPool& pool,
                                                  int node = 0);

  const MoeShape& shape() const { return shape_; }
  WeightType weight_type() const { return type_; }
  // The experts' biases (of this slice: ExpertBiases::slice), if any.
  const ExpertBiases& biases() const { return biases_; }
  int int4_group() const { return type_ == WeightType::int4 ? int_up_.group : 0; }
  // The bf16 layout's shapes. They also set the row strides of the activations the layer keeps
  // in bf16 (LoRA and backward read them), whatever the weight type.
  const kernels::PackedShape& up_shape() const { return gate_up_; }  // gate and up: n = I, k = H
  const kernels::PackedShape& down_shape() const { return down_shape_; }   // down: n = H, k = I
  const bf16* packed(Projection p, int expert) const;  // bf16 only

  // mxfp4 only.
  kernels::Mxfp4Operand packed_mxfp4(Projection p, int expert) const;

  // int8/int4 only.
  const kernels::PackedIntShape& int_shape(Projection p) const { return p == Projection::down ? int_down_ : int_up_; }
  kernels::PackedIntView packed_int(Projection p, int expert) const;
  // int4: whether all three projections of the expert carry their scales in column form
  // (pack_int.hpp), which lets the AMX kernel take int4 at any group size.
  bool int4_column_form(int expert) const;

  // Every byte held for the kernels: codes, scales and their helpers.
  std::size_t bytes() const;
  // The fewest of those bytes that a forward touching every expert must read: the codes (bf16
  // weights, mxfp4 codes and exponents) and one form of the integer scales, for each expert the
  // smaller of its group scales and, where they decomposed, the column form (group multiples and
  // one scale a column); not the column sums. A bandwidth floor counts these: counted with
  // bytes(), int4 at group 128 had a floor about 12 % too high.
  std::size_t streamed_bytes() const;
  std::size_t bytes_per_expert() const { return bytes() / static_cast<std::size_t>(shape_.num_experts); }

 private:
  // q's layer-wide fields (shape, type, biases, the bf16 layout's shapes), its projections checked
  // against them; no weights yet.
  static PackedExpertWeights quantized_layer(const quant::QuantizedExperts& q);
  static PackedExpertWeights pack_mxfp4(const quant::QuantizedExperts& q, numa::ThreadPool& pool, int node);

  MoeShape shape_;
  WeightType type_ = WeightType::bf16;
  ExpertBiases biases_;
  kernels::PackedShape gate_up_{}, down_shape_{};
  numa::NodeBuffer<bf16> gate_, up_, down_;
  kernels::PackedIntShape int_up_{}, int_down_{};
  kernels::PackedMxfp4Shape mx_up_{}, mx_down_{};
  std::array<numa::NodeBuffer<std::uint8_t>, 3> exponents_;  // mxfp4 (codes_ holds its codes)
  std::array<numa::NodeBuffer<std::uint8_t>, 3> codes_;
  std::array<numa::NodeBuffer<float>, 3> scales_;
  std::array<numa::NodeBuffer<std::int32_t>, 3> colsums_;
  // int4: the group scales as multiples of a column scale, where they decompose (per expert).
  std::array<numa::NodeBuffer<float>, 3> column_scales_;
  std::array<numa::NodeBuffer<std::uint8_t>, 3> group_multiples_;
  std::array<std::vector<char>, 3> decomposed_;
};

}  // namespace tilemoe
