#pragma once
// LoRA weights written back as a PEFT adapter directory (adapter_config.json +
// adapter_model.safetensors) under PEFT's own key names, for PEFT, vLLM or SGLang to load: after
// fine-tuning here, or to give back what `tilemoe convert-lora` took in. Each expert's A [r_e, in]
// and B [out, r_e] are written at the expert's own rank (rank_pattern), not the padded one.
//
// The output directory is created if missing (an existing one keeps its other files). Each file
// is written under a temporary name and renamed into place, adapter_model.safetensors first, so a
// failure never leaves a partial file, and a directory the export created is removed again.
#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "src/io/progress.hpp"
#include "src/io/safetensors.hpp"
#include "src/lora/peft_adapter.hpp"
#include "tilemoe/lora.hpp"

namespace tilemoe {

// The dtype of every float tensor written (integer ones stay as they are).
enum class ExportDtype {
  same,  // each tensor as the original PEFT file had it: the round trip is bit-exact
  f32,
  bf16,  // rounded to nearest even
};
std::optional<ExportDtype> parse_export_dtype(std::string_view name);  // "same", "f32", "bf16"

// A tensor written under `key` byte for byte.
struct VerbatimTensor {
  std::string key;
  io::Dtype dtype;
  std::vector<std::int64_t> shape;
  const std::byte* data;  // valid until the export returns
};

// What a PEFT file holds besides routed-expert LoRA: tensors tilemoe does not run (attention
// LoRA, shared experts, modules_to_save) and the file's safetensors metadata.
struct PeftExtras {
  std::vector<VerbatimTensor> tensors;
  std::map<std::string, std::string> file_metadata{{"format", "pt"}};
};
PeftExtras peft_extras(const PeftAdapter& adapter);                 // points into adapter.file()
PeftExtras converted_extras(const io::SafetensorsFile& lora_file);  // what convert-lora kept

struct PeftExportOptions {
  ExportDtype dtype = ExportDtype::same;
  PeftExtras extras;
  ProgressFn progress;  // bytes of tensor data written
};

struct PeftExportStats {
  int layers = 0;
  int expert_tensors = 0;
  int other_tensors = 0;
  std::size_t bytes = 0;  // tensor data
  std::vector<std::string> warnings;
};

// One layer's LoRA as written: factors read in place through `lora` (f32 or bf16, any strides)
// while the export runs, under per-expert key templates or a projection's stacked keys.
struct PeftLayerOut {
  int layer = -1;
  int num_experts = 0;
  LayerLoraView lora;
  // [projection][expert]: the rank an expert is written at (its padding rows and columns dropped);
  // empty: the view's rank. A stacked projection has every expert at the view's rank.
  std::array<std::vector<int>, 3> expert_rank;
  std::array<std::string, 3> key_template_a, key_template_b;  // "{E}" stands for the expert index
  std::array<LoadedLora::StackedKeys, 3> stacked;             // set for a projection written stacked
  // [projection][expert]: each tensor's dtype under ExportDtype::same; empty: the view's own.
  std::array<std::vector<io::Dtype>, 3> dtype_a, dtype_b;
};

// The layers' routed-expert LoRA under their keys, with `config_json` as adapter_config.json.
// Throws invalid_argument for a projection without key names, a stacked one whose experts do not
// all have LoRA at one rank, or projections sharing a stacked A whose A differ.
PeftExportStats write_peft_layers(const std::string& out_dir, const std::string& config_json, const std::vector<PeftLayerOut>& layers,
                                  const PeftExportOptions& options = {});

// `config.json_text` becomes adapter_config.json verbatim. Every projection with LoRA needs its
// PEFT key templates, which load_layer_lora fills; a LoadedLora without dtypes is written as F32
// under ExportDtype::same. Throws invalid_argument for LoRA without key names or whose arrays do
// not match its shape, or an empty config; bad_file naming the path when the directory cannot be
// written.
PeftExportStats write_peft_adapter(const std::string& out_dir, const PeftConfig& config,
                                   const std::vector<std::pair<int, const LoadedLora*>>& layers,
                                   const PeftExportOptions& options = {});

// A file written by `tilemoe convert-lora`, streamed tensor by tensor: memory does not grow with
// the adapter. Throws bad_file naming `lora_file` when it is missing or not such a file.
PeftExportStats export_lora_file(const std::string& lora_file, const std::string& out_dir,
                                 ExportDtype dtype = ExportDtype::same, const ProgressFn& progress = {});

}  // namespace tilemoe
