#include "src/layer/transposed_experts.hpp"

#include "amx/pack_transposed.hpp"
#include "tilemoe/error.hpp"

namespace tilemoe {

TransposedExpertWeights TransposedExpertWeights::build(const PackedExpertWeights& w, const kernels::KernelTable& kt, numa::ThreadPool& pool,
                                                       int node) {
  if (w.weight_type() != WeightType::bf16)
    fail(ErrorKind::unsupported, std::string("backward_weight_copy: needs bf16 base weights (these are ") + weight_type_name(w.weight_type()) +
                                     "; training through them repacks from the quantized codes)");
  const MoeShape& s = w.shape();
  const kernels::PackedShape down = w.down_shape(), gate_up = w.up_shape();
  TransposedExpertWeights t;
  t.down_stride_ = static_cast<std::size_t>(kernels::transposed_kblocks(down.panels)) * kernels::kBlockElements;
  t.down_expert_ = 2 * static_cast<std::size_t>(down.kblocks) * t.down_stride_;
  const std::size_t half = static_cast<std::size_t>(kernels::transposed_kblocks(gate_up.panels)) * kernels::kBlockElements;
  t.gate_up_stride_ = 2 * half;
  t.gate_up_expert_ = 2 * static_cast<std::size_t>(gate_up.kblocks) * t.gate_up_stride_;
  t.down_ = numa::NodeBuffer<bf16>(t.down_expert_ * s.num_experts, node);
  t.gate_up_ = numa::NodeBuffer<bf16>(t.gate_up_expert_ * s.num_experts, node);
  // One item per expert and W k-block: the repack writes both Wᵀ panels of that k-block, in the
  // workers' memory order (first touch on the node's own cores).
  const std::size_t down_items = static_cast<std::size_t>(s.num_experts) * down.kblocks;
  const std::size_t items = down_items + static_cast<std::size_t>(s.num_experts) * gate_up.kblocks;
  pool.parallel_for(items, [&](std::size_t item, int) {
    if (item < down_items) {
      const int e = static_cast<int>(item / down.kblocks), kb = static_cast<int>(item % down.kblocks);
      kt.pack_transposed_kblock(w.packed(Projection::down, e), down.panels, down.kblocks, kb,
                                t.down_.data() + e * t.down_expert_ + 2 * static_cast<std::size_t>(kb) * t.down_stride_, t.down_stride_);
      return;
    }
    item -= down_items;
    const int e = static_cast<int>(item / gate_up.kblocks), kb = static_cast<int>(item % gate_up.kblocks);
    bf16* dst = t.gate_up_.data() + e * t.gate_up_expert_ + 2 * static_cast<std::size_t>(kb) * t.gate_up_stride_;
    kt.pack_transposed_kblock(w.packed(Projection::gate, e), gate_up.panels, gate_up.kblocks, kb, dst, t.gate_up_stride_);
    kt.pack_transposed_kblock(w.packed(Projection::up, e), gate_up.panels, gate_up.kblocks, kb, dst + half, t.gate_up_stride_);
  });
  return t;
}

}  // namespace tilemoe
