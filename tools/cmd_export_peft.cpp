// `tilemoe export-peft`: a file written by convert-lora (after training, say) -> a PEFT adapter
// directory that PEFT, vLLM and SGLang load (see src/lora/peft_export.hpp).
#include <chrono>
#include <cstdio>
#include <memory>

#include "src/lora/peft_export.hpp"
#include "tools/cli_common.hpp"
#include "tools/progress_bar.hpp"

namespace tilemoe::cli {

void add_export_peft_command(CLI::App& app, int& status) {
  struct Args {
    std::string adapter, output, dtype = "same";
  };
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("export-peft", "Write a tilemoe LoRA file back as a PEFT adapter directory");
  cmd->add_option("--adapter", a->adapter, "A file written by `tilemoe convert-lora`")->required();
  cmd->add_option("--output", a->output,
                  "Output directory: adapter_config.json + adapter_model.safetensors (created if missing; those two files are replaced)")
      ->required();
  cmd->add_option("--dtype", a->dtype, "Tensor dtype: same (as the original PEFT adapter, bit-exact), f32 or bf16")
      ->check(CLI::IsMember({"same", "f32", "bf16"}))
      ->capture_default_str();
  cmd->callback([a, &status] {
    auto t0 = std::chrono::steady_clock::now();
    PeftExportStats st;
    {
      ProgressBar bar("exporting");
      st = export_lora_file(a->adapter, a->output, *parse_export_dtype(a->dtype), bar.callback());
    }
    for (const auto& w : st.warnings) warn(w);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("wrote %s: %d MoE layers, %d expert LoRA tensors, %d other tensors, %.1f MB, %.2f s\n", a->output.c_str(),
                st.layers, st.expert_tensors, st.other_tensors, st.bytes / 1e6, s);
    status = 0;
  });
}

}  // namespace tilemoe::cli
