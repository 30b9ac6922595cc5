#pragma once
// PEFT adapters as PEFT's save_pretrained writes them: adapter_config.json plus
// adapter_model.safetensors, keys such as
//   base_model.model.model.layers.1.mlp.experts.0.gate_proj.lora_A.weight
// matched anywhere in the name. Gate and up keep their own A and B.
#include <array>
#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "src/io/safetensors.hpp"
#include "src/lora/lora_weights.hpp"
#include "src/model/model_config.hpp"

namespace tilemoe {

struct PeftConfig {
  int r = 0;
  double lora_alpha = 0;
  bool use_rslora = false;
  std::vector<std::pair<std::string, int>> rank_pattern;
  std::vector<std::pair<std::string, double>> alpha_pattern;
  std::vector<std::string> target_parameters;  // LoRA on stacked expert tensors ("mlp.experts.gate_up_proj")
  std::string json_text;  // kept verbatim so an export writes back what came in
};

PeftConfig read_peft_config(const std::string& adapter_dir);

// One expert's LoRA pair for one projection, as found in the adapter (no data read yet).
struct PeftExpertEntry {
  std::string key_a, key_b;
  int rank = 0;
  double scale = 0;
};

// A LoRA that PEFT puts on a tensor stacking a layer's experts (target_parameters): lora_A
// [r*E, in] holds expert e's A in rows e*r .. e*r+r-1, lora_B [rows, r*E] its B in columns
// j*E + e (PEFT reshapes B to [rows, r, E]). On gate_up_proj one A serves gate and up, whose B
// are rows [0, I) and [I, 2I) of the one B.
struct PeftStackedEntry {
  std::string key_a, key_b;
  std::string parameter;  // PEFT's name of the target: "model.layers.1.mlp.experts.gate_up_proj"
  std::vector<std::pair<Projection, int>> parts;  // each projection it holds, with its first row in B
  int row_step = 1;  // rows of a projection in B: first, first + row_step, ... (gpt-oss interleaves gate and up: 2)
  int rank = 0;
  double scale = 0;
};

// Where expert e's B[row][j] lies in a stacked B [rows, rank*E] (row counted over the whole B).
inline std::size_t peft_stacked_b_index(std::size_t row, int j, int e, int rank, int num_experts) {
  return row * static_cast<std::size_t>(rank) * num_experts + static_cast<std::size_t>(j) * num_experts + e;
}

// Every routed-expert LoRA tensor of an adapter, checked against the model: ranks agree between
// A and B and with adapter_config.json, dimensions match the model, experts and layers exist.
class PeftAdapter {
 public:
  static PeftAdapter open(const std::string& adapter_dir, const ModelConfig& model);

  const std::string& dir() const { return dir_; }
  const PeftConfig& config() const { return config_; }
  const io::SafetensorsFile& file() const { return *file_; }
  std::vector<int> layers() const;  // MoE layers with at least one expert key
  // [projection][expert]; an empty key_a means the adapter does not cover that expert.
  const std::array<std::vector<PeftExpertEntry>, 3>* layer_entries(int layer) const;
  // The layer's LoRA pairs on stacked expert tensors; empty when it has none.
  const std::vector<PeftStackedEntry>& stacked_entries(int layer) const;
  // Keys that are not routed-expert LoRA (attention, shared experts, routers): not ours to run.
  const std::vector<std::string>& other_keys() const { return other_keys_; }
  int ignored_keys() const { return static_cast<int>(other_keys_.size()); }
  int expert_keys() const { return expert_keys_; }
  const std::vector<std::string>& warnings() const { return warnings_; }

 private:
  // Checks a stacked pair (either may be null: reported) and adds it to stacked_.
  void add_stacked_pair(const std::string& pair_key, const io::TensorInfo* a, const io::TensorInfo* b, const ModelConfig& model);

  std::string dir_;
  std::string file_path_;
  PeftConfig config_;
  std::unique_ptr<io::SafetensorsFile> file_;
  std::map<int, std::array<std::vector<PeftExpertEntry>, 3>> layers_;
  std::map<int, std::vector<PeftStackedEntry>> stacked_;
  std::vector<std::string> other_keys_;
  int expert_keys_ = 0;
  std::vector<std::string> warnings_;
};

// A layer's LoRA with the PEFT key of every tensor, so gradients and exports carry PEFT's names.
struct LoadedLora {
  LayerLora lora;
  std::array<std::string, 3> key_template_a, key_template_b;  // "{E}" stands for the expert index
  // [projection][expert]: the dtype of each A and B in the PEFT file (empty where not known), so
  // that an export writes them back as they came.
  std::array<std::vector<io::Dtype>, 3> dtype_a, dtype_b;
  // A projection whose LoRA the adapter stacks over the experts (PeftStackedEntry) has no key
  // templates: its keys are these, with the projection's first row in B, B's rows, and the
  // stacked tensors' dtypes.
  struct StackedKeys {
    std::string key_a, key_b;
    int first_row = 0, b_rows = 0, row_step = 1;
    io::Dtype dtype_a = io::Dtype::F32, dtype_b = io::Dtype::F32;
    bool empty() const { return key_a.empty(); }
  };
  std::array<StackedKeys, 3> stacked;
  // The adapter's adapter_config.json (a convert-lora file keeps it in its metadata; empty when it
  // did not), for a save that writes stacked keys back: their target_parameters are said there.
  std::string adapter_config;
  std::vector<std::string> warnings;

  std::string key_a(Projection p, int e) const;
  std::string key_b(Projection p, int e) const;
};

// The gradients of a layer's stacked LoRA tensors under their PEFT keys, from per-expert
// gradients `grads` of `lora` (as moe_backward gives them): A's gradient [r*E, in] is the sum over
// the projections that share the A (gate and up of gate_up_proj), B's [rows, r*E] is laid out as
// PEFT stores B.
struct StackedLoraGrad {
  std::string key;
  std::vector<std::int64_t> shape;
  std::vector<float> values;
};
std::vector<StackedLoraGrad> stacked_lora_grads(const LoadedLora& lora, const LayerLora& grads);

LoadedLora load_peft_layer(const PeftAdapter& adapter, const MoeShape& shape, int layer);

// --adapter takes a PEFT directory or a file written by `tilemoe convert-lora`.
LoadedLora load_layer_lora(const std::string& adapter_path, const ModelConfig& model, int layer);

}  // namespace tilemoe
