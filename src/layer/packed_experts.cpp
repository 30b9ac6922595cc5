#include "src/layer/packed_experts.hpp"

#include <algorithm>
#include <atomic>
#include <string>
#include <vector>

#include "tilemoe/error.hpp"

namespace tilemoe {

PackedExpertWeights PackedExpertWeights::pack(const ExpertWeightsView& w, numa::ThreadPool& pool, int node) {
  return pack_slice(w, {0, w.shape.intermediate}, pool, node);
}

PackedExpertWeights PackedExpertWeights::pack_slice(const ExpertWeightsView& w, quant::IntermediateSlice slice, numa::ThreadPool& pool,
                                                    int node) {
  const MoeShape& full = w.shape;
  if (slice.begin < 0 || slice.end > full.intermediate || slice.begin >= slice.end)
    fail(ErrorKind::invalid_argument, "pack_slice: [" + std::to_string(slice.begin) + ", " + std::to_string(slice.end) +
                                          ") is not a slice of intermediate " + std::to_string(full.intermediate));
  PackedExpertWeights p;
  MoeShape s = full;
  s.intermediate = slice.width();
  p.shape_ = s;
  if (w.has_biases()) p.biases_ = ExpertBiases::of_view(w).slice(slice.begin, slice.end);
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
    const std::size_t ld = static_cast<std::size_t>(projection_in(full, proj));
    const bf16* src = w.projection(proj, e) + (proj == Projection::down ? static_cast<std::size_t>(slice.begin) : slice.begin * ld);
    kernels::pack_bf16_weights(src, n, k, ld, const_cast<bf16*>(p.packed(proj, e)));
  });
  return p;
}

PackedExpertWeights PackedExpertWeights::quantized_layer(const quant::QuantizedExperts& q) {
  const MoeShape& s = q.shape;
  for (Projection proj : kProjections) {
    const quant::QuantizedProjection& qp = q[proj];
    if (qp.type != q.type || qp.experts != s.num_experts || qp.n != projection_out(s, proj) || qp.k != projection_in(s, proj) ||
        qp.codes.size() != qp.expert_code_bytes() * s.num_experts || qp.scales.size() != qp.expert_scale_count() * s.num_experts ||
        (q.type == WeightType::mxfp4 && qp.group != kMxfp4Group))
      fail(ErrorKind::invalid_argument, std::string("pack_quantized: the ") + projection_name(proj) +
                                            " projection does not match the layer's shape and weight type");
  }
  PackedExpertWeights p;
  p.shape_ = s;
  p.type_ = q.type;
  p.biases_ = q.biases;
  p.gate_up_ = kernels::packed_shape(s.intermediate, s.hidden);
  p.down_shape_ = kernels::packed_shape(s.hidden, s.intermediate);
  return p;
}

PackedExpertWeights PackedExpertWeights::pack_quantized_slice(const quant::QuantizedExperts& q, quant::IntermediateSlice s,
                                                              numa::ThreadPool& pool, int node) {
  if (s.begin == 0 && s.end == q.shape.intermediate) return pack_quantized(q, pool, node);
  return pack_quantized(quant::slice_experts(q, s), pool, node);
}

PackedExpertWeights PackedExpertWeights::pack_quantized(const quant::QuantizedExperts& q, numa::ThreadPool& pool, int node) {
  if (q.type == WeightType::mxfp4) return pack_mxfp4(q, pool, node);
  PackedExpertWeights p = quantized_layer(q);
  const MoeShape& s = q.shape;
  const int bits = q.type == WeightType::int8 ? 8 : 4;
  p.int_up_ = kernels::packed_int_shape(bits, s.intermediate, s.hidden, q.group);
  p.int_down_ = kernels::packed_int_shape(bits, s.hidden, s.intermediate, q.group);
  for (Projection proj : kProjections) {
    const kernels::PackedIntShape& is = p.int_shape(proj);
    const int i = static_cast<int>(proj);
    p.codes_[i] = numa::NodeBuffer<std::uint8_t>(is.code_bytes() * s.num_experts, node);
    p.scales_[i] = numa::NodeBuffer<float>(is.scale_count() * s.num_experts, node);
    p.colsums_[i] = numa::NodeBuffer<std::int32_t>(is.scale_count() * s.num_experts, node);
    if (bits == 4) {
      p.column_scales_[i] = numa::NodeBuffer<float>(static_cast<std::size_t>(is.panels) * 16 * s.num_experts, node);
      p.group_multiples_[i] = numa::NodeBuffer<std::uint8_t>(is.scale_count() * s.num_experts, node);
      p.decomposed_[i].assign(static_cast<std::size_t>(s.num_experts), 0);
    }
  }
  pool.parallel_for(static_cast<std::size_t>(s.num_experts) * 3, [&](std::size_t item, int) {
    const int e = static_cast<int>(item / 3);
    const Projection proj = static_cast<Projection>(item % 3);
    const quant::QuantizedProjection& qp = q[proj];
    const kernels::PackedIntShape& is = p.int_shape(proj);
    const int i = static_cast<int>(proj);
    kernels::pack_int_weights(is, qp.codes_of(e), qp.row_bytes(), qp.scales_of(e), p.codes_[i].data() + is.code_bytes() * e,
                              p.scales_[i].data() + is.scale_count() * e, p.colsums_[i].data() + is.scale_count() * e);
    if (bits == 4)
      p.decomposed_[i][static_cast<std::size_t>(e)] = kernels::decompose_int4_scales(
          is, p.scales_[i].data() + is.scale_count() * e, p.column_scales_[i].data() + static_cast<std::size_t>(is.panels) * 16 * e,
          p.group_multiples_[i].data() + is.scale_count() * e);
  });
  return p;
}

PackedExpertWeights PackedExpertWeights::pack_mxfp4(const quant::QuantizedExperts& q, numa::ThreadPool& pool, int node) {
  PackedExpertWeights p = quantized_layer(q);
  const MoeShape& s = q.shape;
  p.mx_up_ = kernels::packed_mxfp4_shape(s.intermediate, s.hidden);
  p.mx_down_ = kernels::packed_mxfp4_shape(s.hidden, s.intermediate);
  for (Projection proj : kProjections) {
    const kernels::PackedMxfp4Shape& ms = proj == Projection::down ? p.mx_down_ : p.mx_up_;
    const int i = static_cast<int>(proj);
    p.codes_[i] = numa::NodeBuffer<std::uint8_t>(ms.code_bytes() * s.num_experts, node);
    p.exponents_[i] = numa::NodeBuffer<std::uint8_t>(ms.exponent_bytes() * s.num_experts, node);
  }
  // Each item checks its scales (the kernels multiply exactly only these) and packs what passed;
  // the first bad item, in item order, is reported after all have run.
  const std::size_t items = static_cast<std::size_t>(s.num_experts) * 3;
  std::atomic<std::size_t> first_bad{items};
  pool.parallel_for(items, [&](std::size_t item, int) {
    const int e = static_cast<int>(item / 3);
    const Projection proj = static_cast<Projection>(item % 3);
    const quant::QuantizedProjection& qp = q[proj];
    const kernels::PackedMxfp4Shape& ms = proj == Projection::down ? p.mx_down_ : p.mx_up_;
    const int i = static_cast<int>(proj);
    thread_local std::vector<std::uint8_t> exponents;
    exponents.resize(qp.expert_scale_count());
    const float* scales = qp.scales_of(e);
    for (std::size_t j = 0; j < exponents.size(); ++j) {
      if (!quant::valid_mxfp4_scale(scales[j])) {
        std::size_t seen = first_bad.load();
        while (item < seen && !first_bad.compare_exchange_weak(seen, item)) {
        }
        return;
      }
      exponents[j] = static_cast<std::uint8_t>(quant::mxfp4_scale_exponent(scales[j]));
    }
    kernels::pack_mxfp4_weights(ms, reinterpret_cast<const std::uint8_t*>(qp.codes_of(e)), qp.row_bytes(), exponents.data(),
                                static_cast<std::size_t>(qp.groups_per_row()), p.codes_[i].data() + ms.code_bytes() * e,
                                p.exponents_[i].data() + ms.exponent_bytes() * e);
  });
  if (const std::size_t item = first_bad.load(); item < items) {
    const int e = static_cast<int>(item / 3);
    const Projection proj = static_cast<Projection>(item % 3);
    const quant::QuantizedProjection& qp = q[proj];
    const float* scales = qp.scales_of(e);
    std::size_t j = 0;
    while (quant::valid_mxfp4_scale(scales[j])) ++j;
    fail(ErrorKind::invalid_argument, "pack_quantized: expert " + std::to_string(e) + " " + projection_name(proj) + " row " +
                                          std::to_string(j / static_cast<std::size_t>(qp.groups_per_row())) + ": mxfp4 scale " +
                                          std::to_string(scales[j]) + " is not a power of two in [2^-125, 2^125]");
  }
  return p;
}

kernels::Mxfp4Operand PackedExpertWeights::packed_mxfp4(Projection p, int e) const {
  const kernels::PackedMxfp4Shape& ms = p == Projection::down ? mx_down_ : mx_up_;
  const int i = static_cast<int>(p);
  return {ms, {codes_[i].data() + ms.code_bytes() * e, exponents_[i].data() + ms.exponent_bytes() * e}};
}

const bf16* PackedExpertWeights::packed(Projection p, int e) const {
  std::size_t per = p == Projection::down ? static_cast<std::size_t>(down_shape_.n_padded) * down_shape_.k_padded
                                          : static_cast<std::size_t>(gate_up_.n_padded) * gate_up_.k_padded;
  const bf16* base = p == Projection::gate ? gate_.data() : p == Projection::up ? up_.data() : down_.data();
  return base + per * static_cast<std::size_t>(e);
}

kernels::PackedIntView PackedExpertWeights::packed_int(Projection p, int e) const {
  const kernels::PackedIntShape& is = int_shape(p);
  const int i = static_cast<int>(p);
  kernels::PackedIntView v{codes_[i].data() + is.code_bytes() * e, scales_[i].data() + is.scale_count() * e,
                           colsums_[i].data() + is.scale_count() * e};
  if (!decomposed_[i].empty() && decomposed_[i][static_cast<std::size_t>(e)] != 0) {
    v.column_scales = column_scales_[i].data() + static_cast<std::size_t>(is.panels) * 16 * e;
    v.group_multiples = group_multiples_[i].data() + is.scale_count() * e;
  }
  return v;
}

bool PackedExpertWeights::int4_column_form(int e) const {
  for (const auto& d : decomposed_)
    if (d.empty() || d[static_cast<std::size_t>(e)] == 0) return false;
  return true;
}

std::size_t PackedExpertWeights::bytes() const {
  if (type_ == WeightType::bf16) return (gate_.size() + up_.size() + down_.size()) * sizeof(bf16);
  std::size_t total = 0;
  for (int i = 0; i < 3; ++i)
    total += codes_[i].size() + exponents_[i].size() + (scales_[i].size() + colsums_[i].size() + column_scales_[i].size()) * 4 + group_multiples_[i].size();
  return total;
}

std::size_t PackedExpertWeights::streamed_bytes() const {
  if (type_ == WeightType::bf16) return bytes();
  std::size_t total = 0;
  const std::size_t experts = static_cast<std::size_t>(shape_.num_experts);
  for (int i = 0; i < 3; ++i) {
    total += codes_[i].size() + exponents_[i].size();
    if (scales_[i].size() == 0) continue;
    // Per expert: the column form exists only where its scales decomposed.
    const std::size_t scales = scales_[i].size() / experts * 4;
    const std::size_t column_form = decomposed_[i].empty() ? scales : (group_multiples_[i].size() + column_scales_[i].size() * 4) / experts;
    for (std::size_t e = 0; e < experts; ++e)
      total += !decomposed_[i].empty() && decomposed_[i][e] != 0 ? std::min(scales, column_form) : scales;
  }
  return total;
}

}  // namespace tilemoe
