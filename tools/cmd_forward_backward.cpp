// `tilemoe forward` and `tilemoe backward`: one MoE layer of a checkpoint on inputs from a file.
#include <memory>

#include "src/io/safetensors_writer.hpp"
#include "src/layer/moe_compute.hpp"
#include "tilemoe/error.hpp"
#include "tools/cli_common.hpp"

namespace tilemoe::cli {
namespace {

struct LayerArgs {
  std::string model, adapter, input, output, isa = "auto";
  int layer = -1;
  int threads = 0;
};

void add_layer_options(CLI::App* cmd, LayerArgs& a) {
  cmd->add_option("--model", a.model, "Hugging Face checkpoint directory (config.json + safetensors)")->required();
  cmd->add_option("--layer", a.layer, "Index of the MoE layer")->required();
  cmd->add_option("--adapter", a.adapter, "PEFT adapter directory or a file from `tilemoe convert-lora`");
  cmd->add_option("--input", a.input, "safetensors with input [T,H], expert_ids [T,k], weights [T,k]")->required();
  cmd->add_option("--output", a.output, "safetensors to write (replaced only when the command succeeds)")->required();
  cmd->add_option("--isa", a.isa, "reference, portable, avx512, amx or auto")->capture_default_str();
  cmd->add_option("--threads", a.threads, "Worker threads (0: every core)")->capture_default_str();
}

void run(const LayerArgs& a, bool backward) {
  if (a.threads < 0) fail(ErrorKind::invalid_argument, "--threads must be >= 0");
  ComputeOptions opt{a.isa, a.threads};
  resolve_backend(a.isa);  // fail fast, before loading anything
  LoadedLayer l = load_layer(a.model, a.layer, a.adapter);
  LayerInputs in = read_layer_inputs(a.input, l.config.shape.hidden, backward);
  MoeBatch<float> batch{in.tokens, in.top_k, in.input.data(), in.expert_ids.data(), in.weights.data()};
  std::vector<std::int64_t> hidden_shape{in.tokens, l.config.shape.hidden};

  io::SafetensorsWriter out;
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
    for (Projection p : kProjections) {
      const auto& g = grads[p];
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
  auto* fwd = app.add_subcommand("forward", "Run one MoE layer forward; writes `output` (f32 [T,H])");
  add_layer_options(fwd, *fwd_args);
  fwd->callback([fwd_args, &status] { run(*fwd_args, false), status = 0; });

  auto bwd_args = std::make_shared<LayerArgs>();
  auto* bwd = app.add_subcommand("backward",
                                 "Forward and backward of one MoE layer for loss sum(output * grad_output); writes output, "
                                 "grad_input and grad.<PEFT key> for every LoRA tensor of the layer");
  add_layer_options(bwd, *bwd_args);
  bwd->callback([bwd_args, &status] { run(*bwd_args, true), status = 0; });
}

}  // namespace tilemoe::cli
