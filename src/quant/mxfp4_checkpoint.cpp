#include "src/quant/mxfp4_checkpoint.hpp"

#include <atomic>
#include <cmath>
#include <cstring>

#include "amx/pack_mxfp4.hpp"
#include "numa/thread_pool.hpp"

namespace tilemoe::quant {

bool read_mxfp4_layer(const Checkpoint& ck, int layer, QuantizedExperts& out, numa::ThreadPool* pool) {
  const auto refs = ck.expert_tensors(layer);
  for (const auto& projection : refs)
    for (const ExpertTensorRef& r : projection)
      if (r.scales.empty() || !r.stacked()) return false;
  const MoeShape& s = ck.config().shape;
  out = QuantizedExperts{};
  out.shape = s;
  out.type = WeightType::mxfp4;
  out.group = kMxfp4Group;
  for (Projection p : kProjections)
    out[p] = QuantizedProjection::allocate(WeightType::mxfp4, s.num_experts, projection_out(s, p), projection_in(s, p), kMxfp4Group);
  std::atomic<bool> exact{true};
  auto one = [&](std::size_t item, int) {
    const Projection p = kProjections[item % 3];
    const int e = static_cast<int>(item / 3);
    const ExpertTensorRef& r = refs[static_cast<int>(p)][static_cast<std::size_t>(e)];
    QuantizedProjection& qp = out[p];
    const io::SafetensorsFile& blocks_file = *ck.file_of(r.name);
    const io::SafetensorsFile& scales_file = *ck.file_of(r.scales);
    const io::TensorInfo& blocks = blocks_file.get(r.name);
    const io::TensorInfo& scales = scales_file.get(r.scales);
    const Mxfp4StackRows stack{static_cast<std::size_t>(blocks.shape[1]), static_cast<std::size_t>(qp.groups_per_row()), r.first_row,
                               r.row_step};
    const std::size_t groups = stack.groups, row_bytes = qp.row_bytes(), expert = static_cast<std::size_t>(r.stacked_expert);
    const auto* code_data = reinterpret_cast<const std::uint8_t*>(blocks_file.data(blocks));
    const auto* exponent_data = reinterpret_cast<const std::uint8_t*>(scales_file.data(scales));
    for (int i = 0; i < qp.n; ++i) {
      const std::uint8_t* codes = code_data + stack.code_offset(expert, static_cast<std::size_t>(i));
      const std::uint8_t* exponents = exponent_data + stack.exponent_offset(expert, static_cast<std::size_t>(i));
      std::memcpy(qp.codes_of(e) + row_bytes * static_cast<std::size_t>(i), codes, row_bytes);
      float* row_scales = qp.scales_of(e) + groups * static_cast<std::size_t>(i);
      for (std::size_t g = 0; g < groups; ++g) {
        const int exponent = exponents[g];
        if (exponent >= kernels::kMxfp4MinExponent && exponent <= kernels::kMxfp4MaxExponent) {
          row_scales[g] = std::ldexp(1.0f, exponent - kMxfp4ExponentBias);
          continue;
        }
        bool zeros = true;  // codes 0 and 8 (-0) only
        for (std::size_t b = 0; b < kMxfp4GroupBytes; ++b) zeros = zeros && (codes[g * kMxfp4GroupBytes + b] & 0x77) == 0;
        if (!zeros) exact.store(false, std::memory_order_relaxed);
        row_scales[g] = 1.0f;
      }
    }
    // As the bf16 readers do, the expert's pages leave this process's memory once read, by the
    // last projection reading them (up of the interleaved gate_up).
    if (r.first_row + 1 == r.row_step) {
      blocks_file.release(blocks.offset + expert * stack.expert_code_bytes(), stack.expert_code_bytes());
      scales_file.release(scales.offset + expert * stack.expert_exponent_bytes(), stack.expert_exponent_bytes());
    }
  };
  const std::size_t items = static_cast<std::size_t>(s.num_experts) * 3;
  if (pool) pool->parallel_for(items, one);
  else for (std::size_t i = 0; i < items; ++i) one(i, 0);
  if (!exact.load()) return false;
  ExpertWeights biases;
  biases.shape = s;
  ck.load_layer_biases(layer, biases);
  out.biases = ExpertBiases::of_view(biases.view());
  return true;
}

}  // namespace tilemoe::quant
