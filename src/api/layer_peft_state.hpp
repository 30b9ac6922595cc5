#pragma once
// What save_peft_adapter reads of one layer: the LoRA set it uses now and the PEFT names it knows
// for it, copied on the layer's queue so that tasks queued before the save have run.
#include <array>
#include <string>
#include <vector>

#include "src/lora/peft_adapter.hpp"
#include "tilemoe/lora.hpp"
#include "tilemoe/moe_layer.hpp"

namespace tilemoe {

struct LayerPeftState {
  int index = -1;        // the layer's index in the model when it knows it
  int num_experts = 0;
  LayerLoraView view;    // the set in use, read in place (the caller's arrays or the held adapter)
  // The adapter the layer holds (keys, stacked keys, adapter_config.json; no factors or dtypes) and
  // its own rank, scales and expert ranks per projection: the set in use may be the caller's.
  bool has_adapter = false;
  LoadedLora adapter;
  std::array<int, 3> adapter_rank{};
  std::array<std::vector<float>, 3> adapter_scale;
  std::array<std::vector<int>, 3> adapter_expert_rank;
  // A checkpoint layer's expert modules, "model.layers.3.mlp.experts.{E}.gate_proj" (empty for a
  // layer made from memory), or checkpoint_stacked for transformers v5's stacked experts.
  std::array<std::string, 3> checkpoint_modules;
  bool checkpoint_stacked = false;
};

LayerPeftState layer_peft_state(const MoeLayer& layer);

}  // namespace tilemoe
