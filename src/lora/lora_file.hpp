#pragma once
// tilemoe's own LoRA file: one safetensors file with, per MoE layer L and projection P,
//   layer_L.P_lora_a [E, r, in], layer_L.P_lora_b [E, out, r]   (zero for uncovered experts)
//   layer_L.P_lora_mask [E] U8, layer_L.P_lora_scale [E] F32, layer_L.P_lora_rank [E] I32
// and metadata (format, lora_rank, lora_alpha, scaling, num_experts, num_layers, moe_layers,
// hidden_size, intermediate_size, the PEFT key of every tensor, the adapter's config). Stacked per
// layer so a layer's LoRA is a few contiguous reads.
//
// Format version 2 also keeps what `tilemoe export-peft` needs to give back the adapter exactly:
//   peft_dtype.layer_L.P.{a,b}   the PEFT tensors' dtype: one name, or one per expert ("" where
//                                 uncovered) when experts differ; version 1 files have the stored dtype
//   peft_verbatim.<key>          every PEFT tensor that is not routed-expert LoRA (attention LoRA,
//                                 shared experts, modules_to_save), byte for byte
//   peft_file_metadata           the PEFT file's own safetensors metadata, as JSON
//   peft_stacked.layer_L.P.ab    for LoRA that PEFT stacked over the experts (target_parameters):
//                                 {"a": key, "b": key, "first_row": P's first row in B, "b_rows": B's rows,
//                                  "row_step": 2 where gate's and up's rows interleave (gpt-oss; absent: 1)}
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "src/io/progress.hpp"
#include "src/lora/peft_adapter.hpp"

namespace tilemoe {

inline constexpr const char* kLoraFileFormat = "tilemoe-lora";
inline constexpr const char* kLoraFileVersion = "2";
inline constexpr const char* kVerbatimPrefix = "peft_verbatim.";
inline constexpr const char* kPeftFileMetadataKey = "peft_file_metadata";

struct ConvertStats {
  int layers = 0;
  int expert_tensors = 0;
  int other_keys = 0;  // not run by tilemoe, kept verbatim for export
  std::size_t bytes_written = 0;
};

// Streams tensor by tensor: memory use does not grow with the adapter's size.
ConvertStats convert_peft_to_lora_file(const PeftAdapter& adapter, const ModelConfig& model, const std::string& output,
                                       const ProgressFn& progress = {});

LoadedLora load_converted_layer(const std::string& path, const ModelConfig& model, int layer);

// One layer and projection of a converted file, checked for consistency, data not read; nullopt
// when the file has no LoRA there.
struct ConvertedProjection {
  const io::TensorInfo* a = nullptr;  // [E, r, in]
  const io::TensorInfo* b = nullptr;  // [E, out, r]
  int num_experts = 0, rank = 0, in = 0, out = 0;
  std::vector<int> expert_rank;  // [E], 0 where the adapter does not cover the expert
  std::string key_template_a, key_template_b;  // empty in files without PEFT names
  std::vector<io::Dtype> dtype_a, dtype_b;     // [E], the PEFT file's dtypes
  LoadedLora::StackedKeys stacked;             // set when the PEFT file stacked this LoRA over the experts
};
std::optional<ConvertedProjection> converted_projection(const io::SafetensorsFile& f, int layer, Projection p);

// The layers a converted file has LoRA for, ascending.
std::vector<int> converted_layers(const io::SafetensorsFile& f);

// "<path>: not a tilemoe LoRA file ..." unless the file's metadata says it is one; `hint` ends it.
void require_lora_file(const io::SafetensorsFile& f, const std::string& hint);

}  // namespace tilemoe
