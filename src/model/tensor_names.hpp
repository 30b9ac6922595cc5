#pragma once
// Recognises the names under which checkpoints and PEFT adapters store routed-expert tensors,
// whatever the prefix: "...layers.L.mlp.experts.E.gate_proj.weight" (DeepSeek, Qwen-MoE),
// "...layers.L.block_sparse_moe.experts.E.w1.weight" (Mixtral: w1 gate, w3 up, w2 down) and
// "...layers.L.mlp.original_moe.experts.E...." (wrapped MoE blocks); and the stacked form of
// transformers v5, one 3-D tensor for every expert of a layer: "...layers.L.mlp.experts.gate_up_proj"
// [E, 2I, H] (gate's rows, then up's) and "...experts.down_proj" [E, H, I], or one per projection
// ("...experts.gate_proj" / "w1" [E, I, H]); GraniteMoE's "...block_sparse_moe.input_linear.weight"
// [E, 2I, H] and "...output_linear.weight" [E, H, I] are the same two forms under other names.
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

enum class StackedExperts { gate_up, gate, up, down };

struct StackedExpertTensorName {
  int layer = -1;
  StackedExperts kind = StackedExperts::gate_up;
  bool bias = false;             // "...experts.gate_up_proj_bias" or "...experts.down_proj.bias"
  std::string projection_token;  // as written: "gate_up_proj", "w1", ...
};

// nullopt unless the name is "...layers.L.<...>.experts.<projection>[.weight]" (or a bias of that
// form); per-expert names ("experts.E.<projection>...") are parse_expert_tensor_name's.
std::optional<StackedExpertTensorName> parse_stacked_expert_tensor_name(std::string_view name);

// PEFT's LoRA on a stacked expert tensor (LoraConfig.target_parameters, lora.ParamWrapper):
// "...layers.L.mlp.experts[.base_layer...].lora_A[.<adapter>].weight", one A [r*E, in] and one
// B [out, r*E] for every expert; a second targeted tensor of the same module nests its wrapper,
// hence the "base_layer" steps. Which tensor a pair belongs to is told by its shapes.
struct StackedLoraName {
  int layer = -1;
  LoraFactor factor = LoraFactor::a;
  bool bias = false;
  std::string pair_key;  // the name up to ".lora_A" / ".lora_B": A and B of one pair share it
  std::string module;    // PEFT's name of the wrapped module: pair_key without "base_model.model." and "base_layer"
};
std::optional<StackedLoraName> parse_stacked_lora_name(std::string_view name);

// The same name with the expert index replaced by "{E}", so one template covers a layer.
std::string expert_key_template(std::string_view name, int expert);
std::string expand_expert_key_template(std::string_view key_template, int expert);

// "...layers.L.<module path>" of a name, for router and other per-layer tensors.
std::optional<int> parse_layer_index(std::string_view name);

}  // namespace tilemoe
