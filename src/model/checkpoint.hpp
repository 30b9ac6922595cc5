#pragma once
// A Hugging Face checkpoint directory: config.json plus one model.safetensors or shards listed
// in model.safetensors.index.json. Loads one MoE layer's routed experts and router at a time.
#include <array>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "src/io/progress.hpp"
#include "src/io/safetensors.hpp"
#include "src/model/expert_weights.hpp"
#include "src/model/model_config.hpp"

namespace tilemoe {

namespace numa {
class ThreadPool;
}

struct RouterWeights {
  std::vector<float> weight;           // [E][H]
  std::vector<float> correction_bias;  // [E] (DeepSeek-V3's e_score_correction_bias) or empty
  std::vector<float> logit_bias;       // [E] added to the logits (gpt-oss's router.bias) or empty
};

// Where one expert's weight for one projection is stored: a 2-D tensor of its own
// ("experts.E.gate_proj.weight"), or rows of a 3-D tensor that stacks every expert of the layer
// (transformers v5's "experts.gate_up_proj" [E, 2I, H]: gate's rows, then up's).
struct ExpertTensorRef {
  std::string name;         // the stored tensor
  int stacked_expert = -1;  // the expert's index in a stacked tensor; -1 when the tensor is this expert's alone
  int first_row = 0;        // where this projection's rows start in the expert's matrix (up in gate_up_proj: I)
  std::size_t bytes = 0;    // the stored bytes of this expert's projection
  // gpt-oss (ModelConfig::gpt_oss_layout): this projection's output rows are first_row + i * row_step
  // of the stacked tensor's outputs (gate_up_proj interleaves gate's and up's: 0 and 1, step 2),
  // stored as columns of an x W tensor [E, in, out] (`transposed`), or as MXFP4 rows of `name`
  // (the *_blocks tensor) with their scales in `scales` (the *_scales tensor).
  int row_step = 1;
  bool transposed = false;
  std::string scales;
  bool stacked() const { return stacked_expert >= 0; }
};

class Checkpoint {
 public:
  static Checkpoint open(const std::string& model_dir);

  const ModelConfig& config() const { return config_; }
  const std::string& dir() const { return dir_; }

  // Throws when `layer` is not a MoE layer, or an expert tensor is missing, misshapen or duplicated;
  // the message names the directory, layer, expert and projection. F32, F16 and FP8 (with
  // block scales) are converted to bf16. `progress` hears of the bytes read, tensor by tensor.
  ExpertWeights load_layer_experts(int layer, const ProgressFn& progress = {}) const;
  // The same into `into`, whose buffers are reused when it holds a layer of this shape already:
  // a tool that reads layer after layer then touches no fresh memory after the first (the
  // kernel's zeroing and faulting-in of a new GB per layer cost more than reading it). With a
  // pool the tensors are read in parallel, and `progress` is called on the calling thread only.
  void load_layer_experts(int layer, ExpertWeights& into, const ProgressFn& progress, numa::ThreadPool* pool) const;
  RouterWeights load_router(int layer) const;
  // gpt-oss's expert biases into w.gate_bias, up_bias [E][I] and down_bias [E][H] (bf16); a
  // checkpoint without expert biases leaves them empty. load_layer_experts calls it.
  void load_layer_biases(int layer, ExpertWeights& w) const;

  // Where a layer's routed-expert weights are stored, [projection][expert]. Throws as
  // load_layer_experts does for a non-MoE layer, a missing, duplicated or out-of-range expert, or
  // a stacked tensor of the wrong shape or dtype.
  std::array<std::vector<ExpertTensorRef>, 3> expert_tensors(int layer) const;
  // The router weight of a MoE layer and, when stored, its correction bias (names as stored).
  std::vector<std::string> router_tensor_names(int layer) const;
  // The shard holding a stored tensor; nullptr when no shard does.
  const io::SafetensorsFile* file_of(const std::string& name) const;
  const std::vector<std::unique_ptr<io::SafetensorsFile>>& files() const { return files_; }

  std::size_t tensor_count() const { return location_.size(); }

 private:
  struct Location {
    int file;
    const io::TensorInfo* info;
  };
  const Location* find(const std::string& name) const;
  void check_moe_layer(int layer) const;
  // Checks the stored tensor against [rows, cols] and writes it, converted to bf16, to `out`.
  void read_expert_tensor(const ExpertTensorRef& ref, int rows, int cols, const std::string& what, bf16* out) const;
  // Checks a stacked tensor of `layer` and points each expert's slots of `refs` at its rows.
  void add_stacked_experts(int layer, const std::string& name, const Location& loc, std::array<std::vector<ExpertTensorRef>, 3>& refs) const;
  // Points every expert's slot of each projection in `parts` (with its first row) at the stacked
  // tensor `like` describes (name, bytes, layout); a slot already taken is a tensor stored twice.
  void place_stacked_refs(int layer, const ExpertTensorRef& like, const std::vector<std::pair<Projection, int>>& parts,
                          std::array<std::vector<ExpertTensorRef>, 3>& refs) const;
  // gpt-oss's x W stacked tensors and their MXFP4 form (ModelConfig::gpt_oss_layout).
  void add_gpt_oss_experts(int layer, const std::string& name, const Location& loc, bool mxfp4,
                           std::array<std::vector<ExpertTensorRef>, 3>& refs) const;
  void read_gpt_oss_tensor(const ExpertTensorRef& ref, int rows, int cols, bf16* out) const;

  std::string dir_;
  ModelConfig config_;
  std::vector<std::unique_ptr<io::SafetensorsFile>> files_;
  std::unordered_map<std::string, Location> location_;
};

}  // namespace tilemoe
