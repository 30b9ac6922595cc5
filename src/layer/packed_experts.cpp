#include "src/layer/packed_experts.hpp"

namespace tilemoe {

PackedExpertWeights PackedExpertWeights::pack(const ExpertWeightsView& w, numa::ThreadPool& pool, int node) {
  PackedExpertWeights p;
  const MoeShape& s = w.shape;
  p.shape_ = s;
  p.gate_up_ = kernels::packed_shape(s.intermediate, s.hidden);
  p.down_shape_ = kernels::packed_shape(s.hidden, s.intermediate);
  std::size_t gu = kernels::packed_bf16_elements(s.intermediate, s.hidden), d = kernels::packed_bf16_elements(s.hidden, s.intermediate);
  p.gate_ = numa::NodeBuffer<bf16>(gu * s.num_experts, node);
  p.up_ = numa::NodeBuffer<bf16>(gu * s.num_experts, node);
  p.down_ = numa::NodeBuffer<bf16>(d * s.num_experts, node);
  // Packing in the workers also first-touches the pages from the cores that will read them.
  pool.parallel_for(static_cast<std::size_t>(s.num_experts) * 3, [&](std::size_t item, int) {
    int e = static_cast<int>(item / 3);
    Projection proj = static_cast<Projection>(item % 3);
    int n = projection_out(s, proj), k = projection_in(s, proj);
    kernels::pack_bf16_weights(w.projection(proj, e), n, k, static_cast<std::size_t>(k), const_cast<bf16*>(p.packed(proj, e)));
  });
  return p;
}

const bf16* PackedExpertWeights::packed(Projection p, int e) const {
  std::size_t per = p == Projection::down ? static_cast<std::size_t>(down_shape_.n_padded) * down_shape_.k_padded
                                          : static_cast<std::size_t>(gate_up_.n_padded) * gate_up_.k_padded;
  const bf16* base = p == Projection::gate ? gate_.data() : p == Projection::up ? up_.data() : down_.data();
  return base + per * static_cast<std::size_t>(e);
}

}  // namespace tilemoe
