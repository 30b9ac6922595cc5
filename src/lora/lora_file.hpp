#pragma once
// tilemoe's own LoRA file: one safetensors file with, per MoE layer L and projection P,
//   layer_L.P_lora_a [E, r, in], layer_L.P_lora_b [E, out, r]   (zero for uncovered experts)
//   layer_L.P_lora_mask [E] U8, layer_L.P_lora_scale [E] F32, layer_L.P_lora_rank [E] I32
// and metadata (format, lora_rank, lora_alpha, scaling, num_experts, num_layers, moe_layers,
// hidden_size, intermediate_size, the PEFT key of every tensor, the adapter's config). Stacked per
// layer so a layer's LoRA is a few contiguous reads, and the PEFT names survive for export.
#include <cstddef>
#include <functional>
#include <string>

#include "src/lora/peft_adapter.hpp"

namespace tilemoe {

inline constexpr const char* kLoraFileFormat = "tilemoe-lora";

struct ConvertStats {
  int layers = 0;
  int expert_tensors = 0;
  int ignored_keys = 0;
  std::size_t bytes_written = 0;
};

using ProgressFn = std::function<void(std::size_t done_bytes, std::size_t total_bytes)>;

// Streams tensor by tensor: memory use does not grow with the adapter's size.
ConvertStats convert_peft_to_lora_file(const PeftAdapter& adapter, const ModelConfig& model, const std::string& output,
                                       const ProgressFn& progress = {});

LoadedLora load_converted_layer(const std::string& path, const ModelConfig& model, int layer);

}  // namespace tilemoe
