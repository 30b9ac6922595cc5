#pragma once
// The experts' optional biases (gpt-oss's gate_up_proj_bias and down_proj_bias), held in f32:
// gate's and up's are added to those products before the activation, down's to each expert's
// output before the routing weight scales it.
#include <cstddef>
#include <vector>

#include "src/model/expert_weights.hpp"

namespace tilemoe {

struct ExpertBiases {
  int intermediate = 0, hidden = 0;
  std::vector<float> gate, up, down;  // [E][I], [E][I], [E][H]; empty: that projection has none

  bool any() const { return !gate.empty() || !up.empty() || !down.empty(); }
  // Expert e's bias of projection p (projection_out(p) values), or null.
  const float* of(Projection p, int e) const {
    const std::vector<float>& v = p == Projection::gate ? gate : p == Projection::up ? up : down;
    const std::size_t n = static_cast<std::size_t>(p == Projection::down ? hidden : intermediate);
    return v.empty() ? nullptr : v.data() + n * static_cast<std::size_t>(e);
  }

  // What the view holds, in f32.
  static ExpertBiases of_view(const ExpertWeightsView& w) {
    ExpertBiases b;
    b.intermediate = w.shape.intermediate;
    b.hidden = w.shape.hidden;
    const std::size_t ei = static_cast<std::size_t>(w.shape.num_experts) * w.shape.intermediate;
    const std::size_t eh = static_cast<std::size_t>(w.shape.num_experts) * w.shape.hidden;
    auto copy = [](const bf16* src, std::size_t n, std::vector<float>& dst) {
      if (!src) return;
      dst.resize(n);
      for (std::size_t i = 0; i < n; ++i) dst[i] = bf16_to_float(src[i]);
    };
    copy(w.gate_bias, ei, b.gate);
    copy(w.up_bias, ei, b.up);
    copy(w.down_bias, eh, b.down);
    return b;
  }

  // A tensor-parallel node's share: gate's and up's columns [begin, end) of the intermediate
  // dimension; down's whole bias for the slice that starts at 0 and none for the others, since the
  // nodes' partial outputs are added.
  ExpertBiases slice(int begin, int end) const {
    ExpertBiases b;
    b.intermediate = end - begin;
    b.hidden = hidden;
    auto cut = [&](const std::vector<float>& src, std::vector<float>& dst) {
      if (src.empty()) return;
      const std::size_t experts = src.size() / static_cast<std::size_t>(intermediate);
      for (std::size_t e = 0; e < experts; ++e)
        dst.insert(dst.end(), src.begin() + static_cast<std::ptrdiff_t>(e * intermediate + begin),
                   src.begin() + static_cast<std::ptrdiff_t>(e * intermediate + end));
    };
    cut(gate, b.gate);
    cut(up, b.up);
    if (begin == 0) b.down = down;
    return b;
  }
};

}  // namespace tilemoe
