// `tilemoe quantize`: a Hugging Face checkpoint's routed experts -> a directory of int8, int4 or mxfp4
// experts (src/quant/quantized_file.hpp), one layer at a time: read (bf16, F16, F32 or FP8 with
// block scales) and quantize on every core, write that layer's file(s), go on to the next layer
// in the same buffers. Memory stays near one layer's bf16 weights plus its quantized form
// (1.5 x the bf16 layer), whatever the model's size.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <sstream>

#include "src/layer/moe_compute.hpp"
#include "src/quant/mxfp4_checkpoint.hpp"
#include "src/quant/quantization_error.hpp"
#include "src/quant/quantize_into.hpp"
#include "src/quant/quantized_file.hpp"
#include "tilemoe/error.hpp"
#include "tools/cli_common.hpp"
#include "tools/progress_bar.hpp"

namespace tilemoe::cli {
namespace {

// "--layers 1,2,5": ascending, each once.
std::vector<int> parse_layer_list(const std::string& text) {
  std::vector<int> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    std::size_t used = 0;
    int v = -1;
    try {
      v = std::stoi(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (item.empty() || used != item.size() || v < 0)
      fail(ErrorKind::invalid_argument, "--layers: '" + item + "' is not a layer index (give e.g. --layers 1,2,5)");
    out.push_back(v);
  }
  if (out.empty()) fail(ErrorKind::invalid_argument, "--layers is empty");
  std::sort(out.begin(), out.end());
  if (std::adjacent_find(out.begin(), out.end()) != out.end())
    fail(ErrorKind::invalid_argument, "--layers: layer " + std::to_string(*std::adjacent_find(out.begin(), out.end())) + " is listed twice");
  return out;
}

// The bytes of each layer's expert weights as stored, for the progress bar.
std::vector<std::size_t> stored_bytes(const Checkpoint& ck, const std::vector<int>& layers) {
  std::vector<std::size_t> out;
  for (int layer : layers) {
    std::size_t bytes = 0;
    for (const auto& list : ck.expert_tensors(layer))
      for (const auto& ref : list) bytes += ref.bytes;
    out.push_back(bytes);
  }
  return out;
}

}  // namespace

void add_quantize_command(CLI::App& app, int& status) {
  struct Args {
    std::string model, output, weights, layers;
    int group = quant::kDefaultInt4Group, numa_nodes = 1, threads = 0;
  };
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("quantize", "Quantize a checkpoint's routed experts to int8, int4 or mxfp4 and write them to a directory");
  cmd->add_option("--model", a->model, "Hugging Face checkpoint directory (bf16, f16, f32 or FP8 with block scales)")->required();
  cmd->add_option("--output", a->output, "Output directory: new or empty (layer files, quantization.json, config.json, router.safetensors)")
      ->required();
  cmd->add_option("--weights", a->weights,
                  "int8 (one scale per output row), int4 (one scale per group of inputs) or mxfp4 (E2M1, a power-of-two scale per 32 "
                  "inputs; a gpt-oss MXFP4 checkpoint's experts come out exact)")
      ->required()
      ->check(CLI::IsMember({"int8", "int4", "mxfp4"}));
  auto* group = cmd->add_option("--group-size", a->group, "int4 only: inputs per scale, 32, 64 or 128")->capture_default_str();
  cmd->add_option("--numa-nodes", a->numa_nodes,
                  "Split each layer into this many files, one per NUMA node, by slices of the intermediate dimension (multiples of 128)")
      ->capture_default_str();
  cmd->add_option("--layers", a->layers, "Comma-separated MoE layers to quantize (default: every MoE layer)");
  cmd->add_option("--threads", a->threads, "Worker threads (0: every core)")->capture_default_str();
  cmd->callback([a, group, &status] {
    using Clock = std::chrono::steady_clock;
    const auto t0 = Clock::now();
    const WeightType type = quant::parse_weight_type(a->weights, "--weights");
    if (type != WeightType::int4 && group->count() > 0)
      fail(ErrorKind::invalid_argument, "--group-size applies to int4 only (int8 has one scale per output row, mxfp4 one per 32 inputs)");
    if (a->numa_nodes < 1) fail(ErrorKind::invalid_argument, "--numa-nodes " + std::to_string(a->numa_nodes) + ": give 1 or more");
    if (type == WeightType::int4 && !quant::valid_int4_group(a->group))
      fail(ErrorKind::invalid_argument, "--group-size " + std::to_string(a->group) + ": int4 groups are 32, 64 or 128");

    auto ck = Checkpoint::open(a->model);
    const ModelConfig& cfg = ck.config();
    std::vector<int> layers = a->layers.empty() ? cfg.moe_layers : parse_layer_list(a->layers);
    quant::QuantizedModelWriter writer(a->output, quant::spec_for_checkpoint(ck, type, a->group, a->numa_nodes, layers));
    for (const auto& w : writer.copy_routers(ck)) warn(w);

    numa::ThreadPool& pool = pool_for_threads(a->threads);
    quant::QuantizationError error;
    std::size_t read_total = 0, written = 0;
    int as_stored = 0;  // mxfp4 layers the checkpoint stores as MXFP4: copied, exact (no error to add)
    {
      ProgressBar bar("quantizing");
      const std::vector<std::size_t> layer_bytes = stored_bytes(ck, layers);
      std::size_t total = 0;
      for (std::size_t b : layer_bytes) total += b;
      // The two buffers serve every layer: after the first, no fresh memory is touched.
      ExpertWeights w;
      quant::QuantizedExperts q;
      for (std::size_t i = 0; i < layers.size(); ++i) {
        // Reading a layer is the first half of its share of the bar; quantizing and writing it, the second.
        const std::size_t before = read_total;
        if (type == WeightType::mxfp4 && quant::read_mxfp4_layer(ck, layers[i], q, &pool)) {
          written += writer.write_layer(layers[i], q);
          read_total += layer_bytes[i];
          bar.update(read_total, total);
          ++as_stored;
          continue;
        }
        ck.load_layer_experts(layers[i], w, [&](std::size_t done, std::size_t) { bar.update(before + done / 2, total); }, &pool);
        quant::quantize_experts_into(w.view(), type, a->group, &pool, q);
        error.add_layer(w.view(), q, &pool);
        written += writer.write_layer(layers[i], q);
        read_total += layer_bytes[i];
        bar.update(read_total, total);
      }
    }
    writer.commit();
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    std::printf("wrote %s: %zu MoE layers of %d experts, %s%s, %d file(s) per layer; %.2f GB read, %.2f GB written, %.1f s\n",
                a->output.c_str(), layers.size(), cfg.shape.num_experts, a->weights.c_str(),
                type == WeightType::int4 ? (" group " + std::to_string(a->group)).c_str() : "", a->numa_nodes, read_total / 1e9,
                written / 1e9, s);
    std::printf("quantization error (norm-wise relative, dequantized vs bf16): gate %.3e, up %.3e, down %.3e\n",
                error.relative(Projection::gate), error.relative(Projection::up), error.relative(Projection::down));
    if (as_stored > 0)
      std::printf("%d of %zu layers copied as the checkpoint stores them (MXFP4: exact, no bf16 copy); the error above is the "
                  "other layers'\n", as_stored, layers.size());
    status = 0;
  });
}

}  // namespace tilemoe::cli
