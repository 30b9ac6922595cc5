#pragma once
// A layer's own adapter (MoeLayer::load_adapter, CheckpointLayerOptions::adapter), kept as
// AdapterStorage asks: by default in the element type its file stored the factors in, bf16 when
// every factor tensor of the layer was BF16, f32 otherwise. bf16 values widened to f32 and rounded
// back are the same values, so the results do not change; the set takes half the memory, and the
// forward reads half the bytes where it reads the factors as they are (experts with few rows,
// decode above all). AdapterStorage::bf16 rounds other values to nearest even.
#include <cstddef>
#include <vector>

#include "src/lora/lora_view.hpp"
#include "src/lora/peft_adapter.hpp"

namespace tilemoe {

// Whether every factor tensor of the experts `loaded` covers was BF16 in its file (false when a
// dtype is not known, or when the set has no LoRA at all).
bool stored_as_bf16(const LoadedLora& loaded);

class HeldAdapter {
 public:
  explicit HeldAdapter(LoadedLora loaded, AdapterStorage storage = AdapterStorage::as_stored);

  const LayerLoraView& view() const { return view_; }
  LoraDType dtype() const { return view_.proj[0].dtype; }
  // Bytes of the factors held (A and B of every projection).
  std::size_t factor_bytes() const;
  // The PEFT keys of projections the file stacked over the experts.
  LayerPeftStackedKeys stacked_keys() const;
  // Its PEFT keys, file dtypes and adapter_config.json (the f32 factors are gone when held in bf16).
  const LoadedLora& loaded() const { return loaded_; }
  // Each expert's rank in the file ([E], 0 where the adapter does not cover it), before padding.
  const std::vector<int>& expert_rank(Projection p) const;

 private:
  LoadedLora loaded_;  // f32 factors (released when held in bf16), keys, file dtypes, warnings
  LayerLoraBf16 bf16_;
  LayerLoraView view_;
};

}  // namespace tilemoe
