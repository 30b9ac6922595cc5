// `tilemoe bench --convert-lora`: how long `convert-lora` takes on a PEFT adapter of a real
// model's size (DeepSeek-V3: 58 MoE layers x 256 experts, r=16 on gate, up and down, ~13 GB),
// synthesised on disk first.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "src/io/safetensors_writer.hpp"
#include "src/layer/moe_compute.hpp"
#include "src/layer/synthetic_layer.hpp"
#include "src/lora/lora_file.hpp"
#include "tools/cli_common.hpp"

namespace tilemoe::cli {

void run_convert_bench(const std::string& shape_name, int rank, const std::string& workdir) {
  namespace fs = std::filesystem;
  MoeShape s = shape_by_name(shape_name);
  const int first_moe = 3, layers = 58;
  std::string dir = workdir + "/tilemoe_convert_bench";
  fs::remove_all(dir);
  fs::create_directories(dir + "/adapter");
  std::string config = "{\"model_type\":\"deepseek_v3\",\"hidden_size\":" + std::to_string(s.hidden) +
                       ",\"moe_intermediate_size\":" + std::to_string(s.intermediate) + ",\"n_routed_experts\":" +
                       std::to_string(s.num_experts) + ",\"num_experts_per_tok\":" + std::to_string(s.top_k) +
                       ",\"num_hidden_layers\":" + std::to_string(first_moe + layers) + ",\"first_k_dense_replace\":" +
                       std::to_string(first_moe) + ",\"moe_layer_freq\":1}";
  ModelConfig model = parse_model_config(config, "synthetic config.json");
  std::ofstream(dir + "/adapter/adapter_config.json")
      << "{\"peft_type\":\"LORA\",\"r\":" << rank << ",\"lora_alpha\":" << 2 * rank
      << ",\"target_modules\":[\"gate_proj\",\"up_proj\",\"down_proj\"]}";

  // One random block per factor shape, reused: the conversion's cost does not depend on values.
  auto t0 = std::chrono::steady_clock::now();
  io::SafetensorsWriter w;
  std::vector<std::vector<bf16>> blocks;
  for (Projection p : kProjections)
    for (int ab = 0; ab < 2; ++ab) {
      std::size_t n = static_cast<std::size_t>(rank) * (ab == 0 ? projection_in(s, p) : projection_out(s, p));
      auto v = random_activations(n, blocks.size() + 1, 0.05f);
      blocks.push_back(to_bf16(v.data(), n));
    }
  for (int l = first_moe; l < first_moe + layers; ++l)
    for (int e = 0; e < s.num_experts; ++e)
      for (Projection p : kProjections) {
        std::string key = "base_model.model.model.layers." + std::to_string(l) + ".mlp.experts." + std::to_string(e) + "." +
                          projection_name(p) + "_proj.lora_";
        int in = projection_in(s, p), out = projection_out(s, p);
        const auto& a = blocks[static_cast<int>(p) * 2];
        const auto& b = blocks[static_cast<int>(p) * 2 + 1];
        w.add(key + "A.weight", io::Dtype::BF16, {rank, in}, a.data());
        w.add(key + "B.weight", io::Dtype::BF16, {out, rank}, b.data());
      }
  w.write(dir + "/adapter/adapter_model.safetensors");
  double make_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::size_t adapter_bytes = fs::file_size(dir + "/adapter/adapter_model.safetensors");
  std::printf("synthetic %s adapter: %d MoE layers x %d experts, r=%d, %.2f GB, written in %.1f s\n", shape_name.c_str(), layers,
              s.num_experts, rank, adapter_bytes / 1e9, make_s);

  t0 = std::chrono::steady_clock::now();
  PeftAdapter adapter = PeftAdapter::open(dir + "/adapter", model);
  auto stats = convert_peft_to_lora_file(adapter, model, dir + "/converted.safetensors");
  double conv_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("convert-lora: %.2f s (%d layers, %d expert tensors, %.2f GB written, %.2f GB/s)\n", conv_s, stats.layers,
              stats.expert_tensors, stats.bytes_written / 1e9, stats.bytes_written / conv_s / 1e9);
  fs::remove_all(dir);
}

}  // namespace tilemoe::cli
