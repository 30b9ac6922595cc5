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
    // [E, rows, k/32, 16] blocks and [E, rows, k/32] exponents; this projection's rows are
    // first_row + i * row_step (gate and up interleaved in gate_up_proj).
    const std::size_t total_rows = static_cast<std::size_t>(blocks.shape[1]);
    const std::size_t groups = static_cast<std::size_t>(qp.groups_per_row()), row_bytes = qp.row_bytes();
    const auto* code_data = reinterpret_cast<const std::uint8_t*>(blocks_file.data(blocks));
    const auto* exponent_data = reinterpret_cast<const std::uint8_t*>(scales_file.data(scales));
    for (int i = 0; i < qp.n; ++i) {
      const std::size_t row = static_cast<std::size_t>(r.stacked_expert) * total_rows + static_cast<std::size_t>(r.first_row) +
                              static_cast<std::size_t>(i) * static_cast<std::size_t>(r.row_step);
      const std::uint8_t* codes = code_data + row * groups * 16;
      std::memcpy(qp.codes_of(e) + row_bytes * static_cast<std::size_t>(i), codes, row_bytes);
      float* row_scales = qp.scales_of(e) + groups * static_cast<std::size_t>(i);
      for (std::size_t g = 0; g < groups; ++g) {
        const int exponent = exponent_data[row * groups + g];
        if (exponent >= kernels::kMxfp4MinExponent && exponent <= kernels::kMxfp4MaxExponent) {
          row_scales[g] = std::ldexp(1.0f, exponent - kernels::kMxfp4ExponentBias);
          continue;
        }
        bool zeros = true;  // codes 0 and 8 (-0) only
        for (std::size_t b = 0; b < 16; ++b) zeros = zeros && (codes[g * 16 + b] & 0x77) == 0;
        if (!zeros) exact.store(false, std::memory_order_relaxed);
        row_scales[g] = 1.0f;
      }
    }
    // As the bf16 readers do, the expert's pages leave this process's memory once read, by the
    // last projection reading them (up of the interleaved gate_up).
    if (r.first_row + 1 == r.row_step) {
      const std::size_t block_bytes = total_rows * groups * 16, exponent_bytes = total_rows * groups;
      blocks_file.release(blocks.offset + static_cast<std::size_t>(r.stacked_expert) * block_bytes, block_bytes);
      scales_file.release(scales.offset + static_cast<std::size_t>(r.stacked_expert) * exponent_bytes, exponent_bytes);
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
