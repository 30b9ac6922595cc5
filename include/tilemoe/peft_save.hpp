#pragma once
// The LoRA that layers use, written as one PEFT adapter directory (adapter_config.json +
// adapter_model.safetensors) that PEFT, vLLM and SGLang load: what a C++ trainer saves after
// fine-tuning, whether its layers read the caller's arrays (update_lora_weights) or an adapter
// they hold (load_adapter).
//
//   std::vector<tilemoe::PeftSaveLayer> layers;
//   for (auto& [index, layer] : moe_layers) layers.push_back({&layer, index});
//   tilemoe::save_peft_adapter("out/adapter", layers);
//
// Key names, per layer and projection, from the first of:
//   - the adapter the layer holds: its own keys, per expert or stacked over the experts
//     (target_parameters, transformers v5), so that a trained adapter is written back under the
//     names it came with;
//   - the layer's checkpoint: "base_model.model." + the expert's module, e.g.
//     "base_model.model.model.layers.3.mlp.experts.7.gate_proj.lora_A.weight", or Mixtral's
//     "...block_sparse_moe.experts.7.w1...";
//   - PeftSaveOptions::experts_module and projection_names (a layer made from memory).
// Each expert is written at its own rank: the set's rank, or the held adapter's rank for the
// expert where the set's padding rows and columns are zero. adapter_config.json gives r and
// lora_alpha of most modules and rank_pattern / alpha_pattern for the others (alpha = scale * r,
// use_rslora off: the scales the layers apply, whatever made them); a save with stacked keys
// writes the held adapter's adapter_config.json, whose target_parameters name them, after
// checking that the set in use has its ranks and scales. Only routed-expert LoRA is written.
//
// The layers' factors are read in place while the call runs: no layer may change its LoRA set
// meanwhile (the call waits for the tasks queued on each layer before it reads). Files are written
// under temporary names and renamed into place, so a failure leaves no partial adapter.
#include <array>
#include <cstddef>
#include <string>
#include <vector>

#include "tilemoe/moe_layer.hpp"

namespace tilemoe {

struct PeftSaveLayer {
  const MoeLayer* layer = nullptr;
  // Its index in the model; -1: the one the layer knows (from_checkpoint's, or the index its
  // adapter was loaded at). A layer made from memory without an adapter needs it.
  int index = -1;
};

// The tensors' dtype: as each set stores its factors (f32 or bf16), or all f32, or all bf16
// (rounded to nearest even).
enum class PeftSaveDtype { as_held, f32, bf16 };

struct PeftSaveOptions {
  PeftSaveDtype dtype = PeftSaveDtype::as_held;
  // The module of an expert for layers whose adapter and checkpoint give no names: "{layer}" and
  // "{expert}" stand for the indices, followed by "." and the projection's name.
  std::string experts_module = "model.layers.{layer}.mlp.experts.{expert}";
  std::array<std::string, 3> projection_names{"gate_proj", "up_proj", "down_proj"};
  std::string base_model_name_or_path;  // adapter_config.json's field (null when empty)
};

struct PeftSaveStats {
  int layers = 0;        // layers with LoRA written
  int tensors = 0;       // LoRA tensors written
  std::size_t bytes = 0;  // their data
};

// Throws Error(invalid_argument) naming the layer (its position in `layers` and index) for a null
// layer, an unknown or repeated index, no LoRA anywhere, a factor that is NaN or infinite (the
// layer, projection, expert and element named), a projection without key names (a v5
// checkpoint's stacked experts without a held adapter), or stacked keys the set in use does not
// fit (another rank or scale, gate's and up's A apart, experts without LoRA); Error(bad_file)
// naming the path when the directory cannot be written. Nothing is written then.
TILEMOE_CXX_API PeftSaveStats save_peft_adapter(const std::string& dir, const std::vector<PeftSaveLayer>& layers,
                                                const PeftSaveOptions& options = {});

}  // namespace tilemoe
