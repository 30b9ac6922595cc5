// `tilemoe bench`: one MoE layer's forward over token counts, against this machine's measured
// limits (read bandwidth for decode, the ISA's dot-product peak for large batches), with
// weights spread over enough layers that they do not sit in the last-level cache. The options
// are here; the timing is bench_layer.cpp's, convert-lora's timing bench_convert.cpp's.
#include <algorithm>
#include <memory>
#include <sstream>

#include "src/layer/moe_compute.hpp"
#include "src/layer/synthetic_layer.hpp"
#include "src/quant/quantize.hpp"
#include "tilemoe/error.hpp"
#include "tools/bench_layer.hpp"
#include "tools/cli_common.hpp"

namespace tilemoe::cli {
namespace {

std::vector<int> parse_int_list(const std::string& s, const char* what) {
  std::vector<int> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      std::size_t used = 0;
      int v = std::stoi(item, &used);
      if (used != item.size() || v < 0) throw std::invalid_argument(item);
      out.push_back(v);
    } catch (const std::exception&) {
      fail(ErrorKind::invalid_argument, std::string(what) + ": '" + item + "' is not a non-negative integer");
    }
  }
  if (out.empty()) fail(ErrorKind::invalid_argument, std::string(what) + " is empty");
  return out;
}

// --lora-dtype: per entry, whether the LoRA factors are stored as bf16 (else f32).
std::vector<bool> parse_lora_dtypes(const std::string& s) {
  std::vector<bool> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item != "f32" && item != "bf16") fail(ErrorKind::invalid_argument, "--lora-dtype " + s + ": '" + item + "' is neither f32 nor bf16");
    out.push_back(item == "bf16");
  }
  if (out.empty()) fail(ErrorKind::invalid_argument, "--lora-dtype is empty");
  return out;
}

// --one-row-block: per entry, the AMX kernel's form for products of at most 16 rows ("auto": the
// process's default, resolved now).
std::vector<kernels::OneRowTileBlock> parse_one_row_blocks(const std::string& s) {
  std::vector<kernels::OneRowTileBlock> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item != "auto" && !kernels::parse_one_row_tile_block(item))
      fail(ErrorKind::invalid_argument, "--one-row-block " + s + ": '" + item + "' is not auto, pairs or quads");
    out.push_back(kernels::resolve_one_row_tile_block(item));
  }
  if (out.empty()) fail(ErrorKind::invalid_argument, "--one-row-block is empty");
  return out;
}

}  // namespace

void add_bench_command(CLI::App& app, int& status) {
  // The options given as text, parsed when the command runs; the others go straight into `o`.
  struct Args {
    std::string shape = "v2-lite", tokens = "1,16,128,512,4096", ranks = "0,16", isa = "auto", weights = "bf16", lora_dtype = "f32";
    std::string group_sizes = std::to_string(quant::kDefaultInt4Group);
    std::string numa_nodes = "1";
    std::string one_row_blocks = "auto";
    bool convert = false;
    std::string workdir = "/tmp";
    LayerBenchOptions o;
  };
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("bench", "Time one MoE layer's forward (or fine-tuning step) against the machine's measured limits");
  cmd->add_option("--shape", a->shape, "v2-lite, qwen3-30b, v3, mixtral-8x7b, v4-flash or gpt-oss-120b")->capture_default_str();
  cmd->add_option("--tokens", a->tokens, "Comma-separated token counts")->capture_default_str();
  cmd->add_option("--lora-rank", a->ranks, "Comma-separated LoRA ranks on all three projections (0: none); each gets its own layers and the ranks take turns call by call")->capture_default_str();
  cmd->add_option("--isa", a->isa, "portable, avx2, avx512, amx or auto")->capture_default_str();
  cmd->add_option("--weights", a->weights,
                  "Base weight type: bf16, int8 (per-channel scales, int8 activations), int4 or mxfp4 (E2M1, a power-of-two scale per 32 "
                  "inputs, bf16 activations)")
      ->capture_default_str();
  cmd->add_option("--group-size", a->group_sizes,
                  "int4: inputs per scale (32, 64 or 128). Several (128,64): each gets its own layers and they take turns call by call")
      ->capture_default_str();
  cmd->add_option("--threads", a->o.threads, "Worker threads (0: every core)")->capture_default_str();
  cmd->add_option("--numa-nodes", a->numa_nodes,
                  "Split each layer over this many NUMA nodes, real or virtual (cores divided between them); 0: the machine's "
                  "nodes. Several (1,2): each gets its own layers and they take turns call by call")
      ->capture_default_str();
  cmd->add_option("--one-row-block", a->one_row_blocks,
                  "AMX bf16: how products of at most 16 rows run, pairs or quads of panels; auto: TILEMOE_ONE_ROW_BLOCK, else the "
                  "CPU's default. Several (pairs,quads): each gets its own layers and they take turns call by call")
      ->capture_default_str();
  cmd->add_option("--layers", a->o.layers, "Layers to rotate through (0: enough to exceed 4x the last-level cache)");
  cmd->add_option("--iter-scale", a->o.iter_scale, "Multiply the iteration counts")->capture_default_str();
  cmd->add_flag("--json", a->o.json, "One JSON object per case");
  cmd->add_flag("--phases", a->o.phases, "Also print the mean time of each phase of the forward (and backward), page faults per call, and with several NUMA nodes the merge and when each node started and ended");
  cmd->add_flag("--backward", a->o.backward,
                "Time the fine-tuning step instead: forward_sft (saving for backward) then backward, LoRA gradients included");
  cmd->add_option("--lora-dtype", a->lora_dtype,
                  "How the LoRA factors (and with --backward their gradients) are stored: f32 or bf16 (read in place either "
                  "way; bf16 is half the bytes); f32,bf16 gives each its own layers, taking turns call by call")
      ->capture_default_str();
  cmd->add_flag("--lora-held", a->o.lora_held,
                "The LoRA sets are held by the layers, as a loaded adapter is (nothing writes them): packed once, not at every "
                "call as the caller's arrays are");
  cmd->add_flag("--backward-weight-copy", a->o.weight_copy,
                "With --backward: backward reads a Wᵀ copy of the bf16 weights (twice their memory) instead of repacking");
  cmd->add_flag("--grad-overwrite", a->o.grad_overwrite,
                "With --backward: overwrite the LoRA gradients (zeroing every expert's) instead of accumulating into them");
  cmd->add_flag("--onednn", a->o.onednn,
                "Also time the oneDNN baseline (a matmul primitive per expert and projection, weights prepacked by oneDNN, no "
                "LoRA) on the same shape and routings, and print each r=0 time's ratio to it");
  cmd->add_flag("--convert-lora", a->convert,
                "Instead: time convert-lora on a synthetic PEFT adapter of DeepSeek-V3's size (--shape v3 --lora-rank 16)");
  cmd->add_option("--workdir", a->workdir, "Where --convert-lora writes its files (about 2x the adapter's size)")->capture_default_str();
  cmd->callback([a, &status] {
    if (a->convert) {
      auto ranks = parse_int_list(a->ranks == "0,16" ? "16" : a->ranks, "--lora-rank");
      run_convert_bench(a->shape == "v2-lite" ? "v3" : a->shape, std::max(1, ranks.front()), a->workdir);
      status = 0;
      return;
    }
    LayerBenchOptions o = a->o;
    o.shape_name = a->shape;
    o.weights_name = a->weights;
    o.shape = shape_by_name(a->shape);
    o.tokens = parse_int_list(a->tokens, "--tokens");
    o.ranks = parse_int_list(a->ranks, "--lora-rank");
    if (a->isa == "reference") fail(ErrorKind::invalid_argument, "bench times the kernels; --isa reference is not one");
    o.isa = *kernels::parse_isa(resolve_backend(a->isa));
    o.weight_type = quant::parse_weight_type(a->weights, "--weights");
    o.lora_bf16 = parse_lora_dtypes(a->lora_dtype);
    o.node_counts = parse_int_list(a->numa_nodes, "--numa-nodes");
    o.group_sizes = parse_int_list(a->group_sizes, "--group-size");
    if (o.group_sizes.size() > 1 && o.weight_type != WeightType::int4)
      fail(ErrorKind::invalid_argument, "--group-size " + a->group_sizes + ": several group sizes apply to int4 only");
    o.one_row_blocks = parse_one_row_blocks(a->one_row_blocks);
    run_layer_bench(o);
    status = 0;
  });
}

}  // namespace tilemoe::cli
