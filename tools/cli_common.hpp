#pragma once
// What the subcommands share: reading a layer's inputs from a safetensors file, writing results,
// and choosing the implementation.
#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "src/lora/peft_adapter.hpp"
#include "src/model/checkpoint.hpp"

namespace tilemoe::cli {

struct LayerInputs {
  int tokens = 0;
  int top_k = 0;
  std::vector<float> input;             // [T][H]
  std::vector<std::int64_t> expert_ids;  // [T][k]
  std::vector<float> weights;           // [T][k]
  std::vector<float> grad_output;       // [T][H], backward only
};

// --input: `input` (bf16/f32 [T, H]), `expert_ids` (int64/int32 [T, k]), `weights` (f32 [T, k])
// and, when `need_grad_output`, `grad_output` (bf16/f32 [T, H]).
LayerInputs read_layer_inputs(const std::string& path, int hidden, bool need_grad_output);

// The model side of forward/backward: the checkpoint's layer and an optional adapter.
struct LoadedLayer {
  ModelConfig config;
  ExpertWeights experts;
  LoadedLora lora;
};
// load_experts false: the config and adapter only (the experts come from elsewhere).
LoadedLayer load_layer(const std::string& model_dir, int layer, const std::string& adapter, bool load_experts = true);

// Subcommand registration: each returns the callback's exit status through `status`.
void add_forward_backward_commands(CLI::App& app, int& status);
void add_convert_lora_command(CLI::App& app, int& status);
void add_export_peft_command(CLI::App& app, int& status);
void add_quantize_command(CLI::App& app, int& status);
void add_demo_command(CLI::App& app, int& status);
void add_bench_command(CLI::App& app, int& status);
void add_info_command(CLI::App& app, int& status);
void add_train_demo_command(CLI::App& app, int& status);

void warn(const std::string& message);
void run_convert_bench(const std::string& shape_name, int rank, const std::string& workdir);

}  // namespace tilemoe::cli
