#include "src/quant/quantization_error.hpp"

#include <cmath>
#include <string>
#include <vector>

#include "numa/thread_pool.hpp"
#include "tilemoe/error.hpp"

namespace tilemoe::quant {

void QuantizationError::add_layer(const ExpertWeightsView& w, const QuantizedExperts& q, numa::ThreadPool* pool) {
  const MoeShape& s = w.shape;
  if (s.hidden != q.shape.hidden || s.intermediate != q.shape.intermediate || s.num_experts != q.shape.num_experts)
    fail(ErrorKind::invalid_argument, "quantization error: the quantized layer's shape differs from the weights'");
  const std::size_t items = static_cast<std::size_t>(s.num_experts) * 3;
  std::vector<double> err(items), ref(items);
  // Row by row, straight from the codes: no dequantized copy of an expert is made.
  auto one = [&](std::size_t item, int) {
    const Projection p = kProjections[item % 3];
    const int e = static_cast<int>(item / 3);
    const QuantizedProjection& qp = q[p];
    const bf16* src = w.projection(p, e);
    const std::int8_t* codes = qp.codes_of(e);
    const float* scales = qp.scales_of(e);
    const int groups = qp.groups_per_row();
    double e2 = 0.0, r2 = 0.0;
    for (int r = 0; r < qp.n; ++r) {
      const std::int8_t* row = codes + qp.row_bytes() * r;
      const float* row_scales = scales + static_cast<std::size_t>(groups) * r;
      const bf16* wr = src + static_cast<std::size_t>(qp.k) * r;
      for (int kk = 0; kk < qp.k; ++kk) {
        const double ref_v = bf16_to_float(wr[kk]);
        const double d = static_cast<double>(quantized_code_value(qp.type, row, kk)) * row_scales[kk / qp.group] - ref_v;
        e2 += d * d;
        r2 += ref_v * ref_v;
      }
    }
    err[item] = e2;
    ref[item] = r2;
  };
  if (pool) pool->parallel_for(items, one);
  else for (std::size_t i = 0; i < items; ++i) one(i, 0);
  for (std::size_t i = 0; i < items; ++i) {
    err2_[i % 3] += err[i];
    ref2_[i % 3] += ref[i];
  }
}

double QuantizationError::relative(Projection p) const {
  const int i = static_cast<int>(p);
  return ref2_[i] > 0.0 ? std::sqrt(err2_[i] / ref2_[i]) : 0.0;
}

}  // namespace tilemoe::quant
