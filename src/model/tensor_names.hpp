#pragma once
// Recognises the names under which checkpoints and PEFT adapters store routed-expert tensors,
// whatever the prefix: "...layers.L.mlp.experts.E.gate_proj.weight" (DeepSeek, Qwen-MoE),
// "...layers.L.block_sparse_moe.experts.E.w1.weight" (Mixtral: w1 gate, w3 up, w2 down) and
// "...layers.L.mlp.original_moe.experts.E...." (wrapped MoE blocks).
#include <optional>
#include <string>
#include <string_view>

#include "tilemoe/config.hpp"

namespace tilemoe {

enum class LoraFactor { a, b };

struct ExpertTensorName {
  int layer = -1;
  int expert = -1;
  Projection projection = Projection::gate;
  std::optional<LoraFactor> lora;  // set for "...lora_A[.adapter].weight" / "lora_B"
  bool bias = false;               // "...<proj>.bias" or "...lora_B[.adapter].bias" instead of ".weight"
  std::string projection_token;    // as written: "gate_proj", "w1", ...
};

// nullopt when the name is not a routed-expert weight or bias (attention, shared experts, router,
// norms, an FP8 weight's scales...). Biases are named so that loaders can refuse them: the experts
// of the supported models have none, and a bias read past would change the results unseen.
std::optional<ExpertTensorName> parse_expert_tensor_name(std::string_view name);

// The same name with the expert index replaced by "{E}", so one template covers a layer.
std::string expert_key_template(std::string_view name, int expert);
std::string expand_expert_key_template(std::string_view key_template, int expert);

// "...layers.L.<module path>" of a name, for router and other per-layer tensors.
std::optional<int> parse_layer_index(std::string_view name);

}  // namespace tilemoe
