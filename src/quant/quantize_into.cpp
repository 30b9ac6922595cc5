#include "src/quant/quantize_into.hpp"

#include <string>

#include "numa/thread_pool.hpp"
#include "tilemoe/error.hpp"

namespace tilemoe::quant {

void quantize_experts_into(const ExpertWeightsView& w, WeightType type, int group, numa::ThreadPool* pool, QuantizedExperts& out) {
  if (type != WeightType::int8 && type != WeightType::int4 && type != WeightType::mxfp4)
    fail(ErrorKind::invalid_argument, std::string("quantize: weight type ") + weight_type_name(type) + " is not int8, int4 or mxfp4");
  if (type == WeightType::int4 && !valid_int4_group(group))
    fail(ErrorKind::invalid_argument, "quantize: int4 group size " + std::to_string(group) + " is not 32, 64 or 128");
  const MoeShape& s = w.shape;
  if (type == WeightType::mxfp4) group = kMxfp4Group;
  const int q_group = type == WeightType::int8 ? 0 : group;
  const bool reusable = out.type == type && out.group == q_group && out.shape.hidden == s.hidden &&
                        out.shape.intermediate == s.intermediate && out.shape.num_experts == s.num_experts &&
                        !out[Projection::gate].codes.empty();
  if (!reusable) {
    out = QuantizedExperts{};
    out.type = type;
    out.group = q_group;
    for (Projection p : kProjections)
      out[p] = QuantizedProjection::allocate(type, s.num_experts, projection_out(s, p), projection_in(s, p), group);
  }
  out.shape = s;
  out.biases = w.has_biases() ? ExpertBiases::of_view(w) : ExpertBiases{};
  // Every code byte and scale is written below (int4 rows are cleared before their nibbles are
  // set), so stale contents of a reused buffer never show through.
  auto one = [&](std::size_t item, int) {
    const Projection p = kProjections[item % 3];
    const int e = static_cast<int>(item / 3);
    QuantizedProjection& qp = out[p];
    if (type == WeightType::int8)
      quantize_int8_matrix(w.projection(p, e), qp.n, qp.k, qp.k, qp.codes_of(e), qp.scales_of(e));
    else if (type == WeightType::mxfp4)
      quantize_mxfp4_matrix(w.projection(p, e), qp.n, qp.k, qp.k, qp.codes_of(e), qp.scales_of(e));
    else
      quantize_int4_matrix(w.projection(p, e), qp.n, qp.k, qp.k, group, qp.codes_of(e), qp.scales_of(e));
  };
  const std::size_t items = static_cast<std::size_t>(s.num_experts) * 3;
  if (pool) pool->parallel_for(items, one);
  else for (std::size_t i = 0; i < items; ++i) one(i, 0);
}

}  // namespace tilemoe::quant
