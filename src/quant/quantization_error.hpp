#pragma once
// How far quantized weights are from the bf16 weights they were made from: the norm-wise
// relative error ||dequantized - w|| / ||w|| of each projection, summed over the layers added.
#include <array>

#include "src/quant/quantize.hpp"

namespace tilemoe::quant {

class QuantizationError {
 public:
  // `q` must be the quantization of `w` (same shape); in parallel on `pool` when given.
  void add_layer(const ExpertWeightsView& w, const QuantizedExperts& q, numa::ThreadPool* pool);
  // 0 before anything was added, or when every weight added was 0.
  double relative(Projection p) const;

 private:
  std::array<double, 3> err2_{}, ref2_{};
};

}  // namespace tilemoe::quant
