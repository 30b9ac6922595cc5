// `tilemoe forward` and `tilemoe backward`: one MoE layer of a checkpoint, on inputs from a file
// or on random hidden states routed by the layer's own router.
#include <memory>

#include "src/io/safetensors_writer.hpp"
#include "src/layer/moe_compute.hpp"
#include "src/model/checkpoint.hpp"
#include "src/quant/checkpoint_fingerprint.hpp"
#include "src/quant/mxfp4_checkpoint.hpp"
#include "src/quant/quantized_file.hpp"
#include "src/routing/router.hpp"
#include "tilemoe/error.hpp"
#include "tools/cli_common.hpp"
#include "tools/random_normal.hpp"

namespace tilemoe::cli {
namespace {

constexpr int kMaxRandomTokens = 1 << 20;

struct LayerArgs {
  std::string model, adapter, input, output, isa = "auto", weights = "bf16", quantized;
  int group_size = 128;
  int layer = -1;
  int threads = 0;
  int numa_nodes = 1;
  int tokens = 0;
  std::uint64_t seed = 0;
  bool backward_weight_copy = false;
  CLI::Option *input_given = nullptr, *tokens_given = nullptr, *seed_given = nullptr;
};

void add_layer_options(CLI::App* cmd, LayerArgs& a) {
  cmd->add_option("--model", a.model, "Hugging Face checkpoint directory (config.json + safetensors)")->required();
  cmd->add_option("--layer", a.layer, "Index of the MoE layer")->required();
  cmd->add_option("--adapter", a.adapter, "PEFT adapter directory or a file from `tilemoe convert-lora`");
  a.input_given = cmd->add_option("--input", a.input,
                                  "safetensors with input [T,H], expert_ids [T,k], weights [T,k] (and grad_output [T,H] for backward)");
  a.tokens_given = cmd->add_option("--tokens", a.tokens,
                                   "Instead of --input: N random hidden states (normal, std 1, bf16), routed by the layer's router; the "
                                   "output file then holds them too, to replay with --input");
  a.seed_given = cmd->add_option("--seed", a.seed, "With --tokens: the random inputs' seed")->capture_default_str();
  cmd->add_option("--output", a.output, "safetensors to write (replaced only when the command succeeds)")->required();
  cmd->add_option("--isa", a.isa, "reference, portable, avx2, avx512, amx or auto")->capture_default_str();
  cmd->add_option("--threads", a.threads, "Worker threads (0: every core)")->capture_default_str();
  cmd->add_option("--numa-nodes", a.numa_nodes,
                  "Split the layer over this many NUMA nodes, real or virtual (cores divided between them); 0: the machine's")
      ->capture_default_str();
  cmd->add_option("--weights", a.weights,
                  "Base weights: bf16, or int8 / int4 / mxfp4 quantized at load (int8 activations per token, mxfp4 bf16 ones; "
                  "backward trains through them; a gpt-oss MXFP4 checkpoint's experts are exact in mxfp4)")
      ->capture_default_str();
  cmd->add_option("--group-size", a.group_size, "int4: inputs per scale (32, 64 or 128)")->capture_default_str();
  cmd->add_option("--quantized", a.quantized,
                  "A directory written by `tilemoe quantize` from --model: its int8/int4/mxfp4 experts are used as they are");
}

void check_input_choice(const LayerArgs& a) {
  const bool input = a.input_given->count() > 0, tokens = a.tokens_given->count() > 0;
  if (input && tokens) fail(ErrorKind::invalid_argument, "give --input FILE or --tokens N, not both");
  if (!input && !tokens)
    fail(ErrorKind::invalid_argument, "give --input FILE (inputs and routing) or --tokens N (random inputs routed by the layer's router)");
  if (tokens && (a.tokens < 1 || a.tokens > kMaxRandomTokens))
    fail(ErrorKind::invalid_argument, "--tokens must be in [1, " + std::to_string(kMaxRandomTokens) + "], got " + std::to_string(a.tokens));
  if (input && a.seed_given->count() > 0) fail(ErrorKind::invalid_argument, "--seed goes with --tokens (an --input file holds its inputs)");
}

// --tokens: what an --input file would hold, made here. Kept in bf16 as well, for the output
// file, so that replaying it with --input sees exactly these values.
struct RandomInputs {
  std::vector<bf16> input, grad_output;
  Routing routing;
};

RandomInputs make_random_inputs(const LayerArgs& a, const ModelConfig& config, bool backward) {
  auto ck = Checkpoint::open(a.model);
  RouterWeights router = ck.load_router(a.layer);
  const std::size_t n = static_cast<std::size_t>(a.tokens) * config.shape.hidden;
  RandomInputs r;
  r.input = random_normal_bf16(n, a.seed, 0);
  if (backward) r.grad_output = random_normal_bf16(n, a.seed, 1);
  r.routing = route_tokens(config, router, a.layer, r.input.data(), a.tokens, &pool_for_threads(a.threads));
  return r;
}

std::vector<float> to_f32(const std::vector<bf16>& v) {
  std::vector<float> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = bf16_to_float(v[i]);
  return out;
}

LayerInputs as_layer_inputs(const RandomInputs& r) {
  LayerInputs in;
  in.tokens = r.routing.tokens;
  in.top_k = r.routing.top_k;
  in.input = to_f32(r.input);
  in.expert_ids = r.routing.expert_ids;
  in.weights = r.routing.weights;
  in.grad_output = to_f32(r.grad_output);
  return in;
}

// So that `--input` on the output file replays the run.
void add_random_inputs(io::SafetensorsWriter& out, const RandomInputs& r, int hidden, const LayerArgs& a) {
  std::vector<std::int64_t> hidden_shape{r.routing.tokens, hidden}, routing_shape{r.routing.tokens, r.routing.top_k};
  out.add("input", io::Dtype::BF16, hidden_shape, r.input.data());
  out.add("expert_ids", io::Dtype::I64, routing_shape, r.routing.expert_ids.data());
  out.add_f32("weights", routing_shape, r.routing.weights);
  if (!r.grad_output.empty()) out.add("grad_output", io::Dtype::BF16, hidden_shape, r.grad_output.data());
  out.set_metadata("tilemoe_inputs", "random normal, seed " + std::to_string(a.seed) + ", routed by the layer " + std::to_string(a.layer) +
                                         " router");
}

void run(const LayerArgs& a, bool backward) {
  check_input_choice(a);
  if (a.threads < 0) fail(ErrorKind::invalid_argument, "--threads must be >= 0");
  if (a.numa_nodes < 0) fail(ErrorKind::invalid_argument, "--numa-nodes must be >= 0 (0: the machine's nodes)");
  ComputeOptions opt{a.isa, a.threads, a.numa_nodes};
  opt.backward_weight_copy = a.backward_weight_copy;
  opt.weight_type = quant::parse_weight_type(a.weights, "--weights");
  opt.group_size = a.group_size;
  if (opt.weight_type == WeightType::int4 && a.group_size != 32 && a.group_size != 64 && a.group_size != 128)
    fail(ErrorKind::invalid_argument, "--group-size " + std::to_string(a.group_size) + ": give 32, 64 or 128");
  resolve_backend(a.isa);  // fail fast, before loading anything
  // With --quantized, or mxfp4 from a checkpoint that stores MXFP4 (taken as stored), the bf16
  // experts are not read at all.
  quant::QuantizedExperts loaded;
  const bool native_mxfp4 =
      a.quantized.empty() && opt.weight_type == WeightType::mxfp4 && quant::read_mxfp4_layer(Checkpoint::open(a.model), a.layer, loaded);
  LoadedLayer l = load_layer(a.model, a.layer, a.adapter, /*load_experts=*/a.quantized.empty() && !native_mxfp4);
  if (native_mxfp4) {
    opt.quantized = &loaded;
    l.experts.shape = l.config.shape;
  }
  if (!a.quantized.empty()) {
    const Checkpoint ck = Checkpoint::open(a.model);
    loaded = quant::load_quantized_layer(a.quantized, a.layer, l.config.shape, quant::checkpoint_fingerprint(ck));
    // The experts' biases (gpt-oss) are not quantized and not in the directory: the checkpoint's.
    ExpertWeights biases;
    biases.shape = l.config.shape;
    ck.load_layer_biases(a.layer, biases);
    loaded.biases = ExpertBiases::of_view(biases.view());
    if (opt.weight_type != WeightType::bf16 && opt.weight_type != loaded.type)
      fail(ErrorKind::invalid_argument, "--quantized " + a.quantized + " holds " + weight_type_name(loaded.type) + " weights, not " + a.weights);
    opt.quantized = &loaded;
    l.experts.shape = l.config.shape;
  }
  const bool random_inputs = a.tokens_given->count() > 0;
  RandomInputs made;
  LayerInputs in;
  if (random_inputs) {
    made = make_random_inputs(a, l.config, backward);
    in = as_layer_inputs(made);
  } else {
    in = read_layer_inputs(a.input, l.config.shape.hidden, backward);
  }
  MoeBatch<float> batch{in.tokens, in.top_k, in.input.data(), in.expert_ids.data(), in.weights.data()};
  std::vector<std::int64_t> hidden_shape{in.tokens, l.config.shape.hidden};

  io::SafetensorsWriter out;  // holds pointers into `made` until write()
  if (random_inputs) add_random_inputs(out, made, l.config.shape.hidden, a);
  std::vector<float> y(static_cast<std::size_t>(in.tokens) * l.config.shape.hidden);
  if (!backward) {
    moe_forward(l.experts.view(), l.lora.lora, batch, opt, y.data());
    out.add_f32("output", hidden_shape, std::move(y));
  } else {
    std::vector<float> dx(y.size());
    LayerLora grads = l.lora.lora.zeros_like();
    moe_backward(l.experts.view(), l.lora.lora, batch, in.grad_output.data(), opt, y.data(), dx.data(), &grads);
    out.add_f32("output", hidden_shape, std::move(y));
    out.add_f32("grad_input", hidden_shape, std::move(dx));
    for (auto& g : stacked_lora_grads(l.lora, grads)) out.add_f32("grad." + g.key, std::move(g.shape), std::move(g.values));
    for (Projection p : kProjections) {
      const auto& g = grads[p];
      if (!l.lora.stacked[static_cast<int>(p)].empty()) continue;  // written above, under the stacked keys
      for (int e = 0; e < l.config.shape.num_experts; ++e) {
        if (g.rank == 0 || !g.present[e]) continue;
        int r = g.expert_rank[e];
        std::vector<float> ga(g.a_of(e), g.a_of(e) + static_cast<std::size_t>(r) * g.in);
        std::vector<float> gb(static_cast<std::size_t>(g.out) * r);
        for (int o = 0; o < g.out; ++o)
          for (int c = 0; c < r; ++c) gb[static_cast<std::size_t>(o) * r + c] = g.b_of(e)[static_cast<std::size_t>(o) * g.rank + c];
        std::string ka = l.lora.key_a(p, e), kb = l.lora.key_b(p, e);
        if (ka.find("{E}") != std::string::npos || ka.empty()) {
          ka = "layer_" + std::to_string(a.layer) + "." + projection_name(p) + "_lora_a." + std::to_string(e);
          kb = "layer_" + std::to_string(a.layer) + "." + projection_name(p) + "_lora_b." + std::to_string(e);
        }
        out.add_f32("grad." + ka, {r, g.in}, std::move(ga));
        out.add_f32("grad." + kb, {g.out, r}, std::move(gb));
      }
    }
  }
  out.set_metadata("tilemoe_backend", resolve_backend(a.isa));
  out.write(a.output);
}

}  // namespace

void add_forward_backward_commands(CLI::App& app, int& status) {
  auto fwd_args = std::make_shared<LayerArgs>();
  auto* fwd = app.add_subcommand("forward", "Run one MoE layer forward; writes `output` (f32 [T,H]) and, with --tokens, the inputs made");
  add_layer_options(fwd, *fwd_args);
  fwd->callback([fwd_args, &status] { run(*fwd_args, false), status = 0; });

  auto bwd_args = std::make_shared<LayerArgs>();
  auto* bwd = app.add_subcommand("backward",
                                 "Forward and backward of one MoE layer for loss sum(output * grad_output); writes output, "
                                 "grad_input and grad.<PEFT key> for every LoRA tensor of the layer and, with --tokens, the inputs made");
  add_layer_options(bwd, *bwd_args);
  bwd->add_flag("--backward-weight-copy", bwd_args->backward_weight_copy,
                "Backward reads a second copy of the bf16 weights packed transposed (twice their memory) instead of repacking");
  bwd->callback([bwd_args, &status] { run(*bwd_args, true), status = 0; });
}

}  // namespace tilemoe::cli
