// `tilemoe convert-lora`: a PEFT adapter -> one stacked tilemoe LoRA file (see src/lora/lora_file.hpp).
#include <chrono>
#include <cstdio>
#include <memory>

#include "src/lora/lora_file.hpp"
#include "tools/cli_common.hpp"
#include "tools/progress_bar.hpp"

namespace tilemoe::cli {

void add_convert_lora_command(CLI::App& app, int& status) {
  struct Args {
    std::string adapter, model, output;
  };
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("convert-lora", "Convert a PEFT adapter into one stacked tilemoe LoRA file");
  cmd->add_option("--adapter", a->adapter, "PEFT adapter directory (adapter_config.json + adapter_model.safetensors)")->required();
  cmd->add_option("--model", a->model, "The checkpoint directory the adapter belongs to (its config.json)")->required();
  cmd->add_option("--output", a->output, "Output .safetensors file")->required();
  cmd->callback([a, &status] {
    auto t0 = std::chrono::steady_clock::now();
    ModelConfig model = read_model_config(a->model);
    PeftAdapter adapter = PeftAdapter::open(a->adapter, model);
    for (const auto& w : adapter.warnings()) warn(w);
    ConvertStats st;
    {
      ProgressBar bar("converting");
      st = convert_peft_to_lora_file(adapter, model, a->output, bar.callback());
    }
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("wrote %s: %d MoE layers, %d expert LoRA tensors, %.1f MB, %d other keys kept for export-peft, %.2f s\n",
                a->output.c_str(), st.layers, st.expert_tensors, st.bytes_written / 1e6, st.other_keys, s);
    status = 0;
  });
}

}  // namespace tilemoe::cli
