#pragma once
// What tilemoe needs from a Hugging Face config.json: the MoE shape, which layers are MoE, and
// how the router scores experts.
#include <string>
#include <vector>

#include "tilemoe/config.hpp"

namespace tilemoe {

struct ModelConfig {
  std::string model_type;   // "deepseek_v2", "deepseek_v3", "qwen2_moe", "qwen3_moe", "mixtral"
  MoeShape shape;
  int num_layers = 0;
  std::vector<int> moe_layers;
  // Router (src/routing/router.hpp), as transformers runs it for model_type: these say what the
  // router does, which is not always what config.json writes (see read_deepseek_router).
  std::string scoring_func = "softmax";  // or "sigmoid" (DeepSeek-V3), "sqrtsoftplus" (DeepSeek-V4)
  std::string topk_method = "greedy";    // "greedy", "group_limited_greedy", "noaux_tc"
  bool norm_topk_prob = false;           // divide the top-k weights by their sum (Mixtral always)
  double routed_scaling_factor = 1.0;    // then multiply them by this (DeepSeek)
  int n_group = 1;                       // group_limited_greedy and noaux_tc only
  int topk_group = 1;
  bool unchosen_groups_neg_inf = false;  // experts outside the chosen groups masked to -inf (Kimi-Linear), not 0.0
  // Non-empty for a model_type whose router tilemoe does not compute (PhiMoE's sparsemixer): why.
  // Its experts still run with the ids and weights a caller gives.
  std::string routing_unsupported;
  // MoE layers whose experts are chosen by token id (DeepSeek-V4's hash_moe layers: a fixed tid2eid
  // table), which the router cannot compute from hidden states: their experts run with given ids.
  std::vector<int> hash_routed_layers;
  // FP8 expert weights (DeepSeek-V3/R1): one weight_scale_inv per block of this many rows and
  // columns, from quantization_config.weight_block_size (DeepSeek ships [128, 128]).
  int fp8_block_rows = 128;
  int fp8_block_cols = 128;
  // quantization_config.quant_method as written ("fp8", "gptq", "awq", ...), empty without one: what
  // an error names when the experts are stored in a form this loader does not read.
  std::string quant_method;
  // gpt-oss (model_type gpt_oss): the experts stacked as x W tensors, gate_up_proj [E, H, 2I] with
  // gate's and up's columns interleaved and down_proj [E, I, H] (or their MXFP4 form: *_blocks
  // [E, out, in/32, 16] and *_scales [E, out, in/32], out's rows interleaved the same way), with
  // biases gate_up_proj_bias [E, 2I] and down_proj_bias [E, H]; the router "...mlp.router" adds
  // its bias to the logits.
  bool gpt_oss_layout = false;

  bool is_moe_layer(int layer) const;
  bool is_hash_routed(int layer) const;
  std::string moe_layers_string() const;  // "1, 2"
};

// Reads <dir>/config.json; errors name the file and the missing or wrong field.
ModelConfig read_model_config(const std::string& model_dir);
ModelConfig parse_model_config(const std::string& json_text, const std::string& source_name);

}  // namespace tilemoe
