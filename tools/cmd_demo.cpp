// `tilemoe demo`: a synthetic layer of DeepSeek-V2-Lite's shape with LoRA r=16, forward and
// backward on the chosen implementation, timed, and checked against the float64 reference path.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>

#include "amx/isa.hpp"
#include "src/layer/moe_compute.hpp"
#include "src/layer/moe_sft_layer.hpp"
#include "src/layer/synthetic_layer.hpp"
#include "tools/cli_common.hpp"

namespace tilemoe::cli {
namespace {

double rel_error(const std::vector<float>& got, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    num += (got[i] - ref[i]) * (got[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / (den > 0 ? den : 1));
}

template <typename F>
double time_ms(F&& f) {
  auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

void add_demo_command(CLI::App& app, int& status) {
  struct Args {
    std::string shape = "v2-lite", isa = "auto";
    int tokens = 64, rank = 16, threads = 0;
    unsigned seed = 1;
  };
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("demo", "Forward and backward of a synthetic layer, timed and checked against the reference");
  cmd->add_option("--shape", a->shape, "v2-lite, qwen3-30b, v3, mixtral-8x7b, v4-flash or gpt-oss-120b")->capture_default_str();
  cmd->add_option("--tokens", a->tokens, "Tokens in the batch")->capture_default_str()->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--lora-rank", a->rank, "LoRA rank on gate, up and down (0: none)")->capture_default_str()->check(CLI::Range(0, 1024));
  cmd->add_option("--isa", a->isa, "reference, portable, avx2, avx512, amx or auto")->capture_default_str();
  cmd->add_option("--threads", a->threads, "Worker threads (0: every core)")->capture_default_str();
  cmd->add_option("--seed", a->seed, "Random seed")->capture_default_str();
  cmd->callback([a, &status] {
    MoeShape s = shape_by_name(a->shape);
    std::string backend = resolve_backend(a->isa);
    std::printf("tilemoe demo: shape %s (hidden %d, intermediate %d, %d experts, top-%d), %d tokens, LoRA r=%d\n", a->shape.c_str(),
                s.hidden, s.intermediate, s.num_experts, s.top_k, a->tokens, a->rank);
    ExpertWeights w;
    LayerLora lora;
    double gen_ms = time_ms([&] {
      w = random_expert_weights(s, a->seed, &pool_for_threads(a->threads));
      lora = random_lora(s, a->rank, 2.0f * a->rank, a->seed + 7);
    });
    auto routing = random_routing(a->tokens, s, a->seed + 11);
    auto x = random_activations(static_cast<std::size_t>(a->tokens) * s.hidden, a->seed + 13);
    auto dy = random_activations(static_cast<std::size_t>(a->tokens) * s.hidden, a->seed + 17);
    std::printf("  synthetic weights: %.1f MB, made in %.0f ms\n", 3.0 * w.gate.size() * 2 / 1e6, gen_ms);
    MoeBatch<float> batch{a->tokens, s.top_k, x.data(), routing.expert_ids.data(), routing.weights.data()};
    ComputeOptions opt{a->isa, a->threads};

    std::vector<float> y(x.size()), dx(x.size());
    LayerLora grads = lora.zeros_like();
    double fwd_ms = 0, bwd_ms = 0, pack_ms = 0;
    if (backend == "reference") {
      fwd_ms = time_ms([&] { moe_forward(w.view(), lora, batch, opt, y.data()); });
      bwd_ms = time_ms([&] { moe_backward(w.view(), lora, batch, dy.data(), opt, nullptr, dx.data(), &grads); });
    } else {
      numa::ThreadPool& pool = pool_for_threads(a->threads);
      PackedExpertWeights packed;
      pack_ms = time_ms([&] { packed = PackedExpertWeights::pack(w.view(), pool); });
      MoeSftLayer layer(packed, *kernels::parse_isa(backend), pool, {a->tokens, 1, a->rank}, lora_view(lora));
      auto xb = to_bf16(x.data(), x.size());
      auto forward = [&](bool save) {
        layer.forward_sft(a->tokens, s.top_k, xb.data(), routing.expert_ids.data(), routing.weights.data(), y.data(), save);
      };
      auto backward = [&] { layer.backward(dy.data(), dx.data(), lora_grad_view(grads)); };
      forward(true);  // warm-up: first-touch of the scratch buffers
      backward();
      fwd_ms = bwd_ms = 1e30;
      for (int i = 0; i < 5; ++i) {
        fwd_ms = std::min(fwd_ms, time_ms([&] { forward(true); }));
        bwd_ms = std::min(bwd_ms, time_ms(backward));
      }
      std::printf("  packed the layer for the kernels in %.0f ms, on %d threads\n", pack_ms, pool.size());
    }

    // The oracle: the same layer in float64.
    LayerLoraT<double> lora64 = lora.cast<double>();
    std::vector<double> x64(x.begin(), x.end()), dy64(dy.begin(), dy.end()), wts64(routing.weights.begin(), routing.weights.end());
    MoeBatch<double> batch64{a->tokens, s.top_k, x64.data(), routing.expert_ids.data(), wts64.data()};
    std::vector<double> y64(x.size()), dx64(x.size());
    LayerLoraT<double> grads64 = lora64.zeros_like();
    reference_forward(w.view(), lora64, batch64, y64.data());
    reference_backward(w.view(), lora64, batch64, dy64.data(), dx64.data(), &grads64);
    double lora_err = 0;
    for (Projection p : kProjections) {
      if (grads[p].rank == 0) continue;
      std::vector<double> ra(grads64[p].a.begin(), grads64[p].a.end()), rb(grads64[p].b.begin(), grads64[p].b.end());
      lora_err = std::max({lora_err, rel_error(grads[p].a, ra), rel_error(grads[p].b, rb)});
    }
    const auto isa = kernels::parse_isa(backend);
    std::printf("  implementation: %s\n", isa ? kernels::isa_label(*isa).c_str() : backend.c_str());
    std::printf("  forward:  %8.2f ms   rel. error vs float64 reference %.2e\n", fwd_ms, rel_error(y, y64));
    std::printf("  backward: %8.2f ms   grad_input rel. error %.2e, worst LoRA gradient rel. error %.2e\n", bwd_ms,
                rel_error(dx, dx64), lora_err);
    bool ok = rel_error(y, y64) <= 1e-2 && rel_error(dx, dx64) <= 1e-2 && lora_err <= 2e-2;
    std::printf("  %s\n", ok ? "OK: within 1e-2 (output, grad_input) and 2e-2 (LoRA gradients)" : "FAILED: error above tolerance");
    status = ok ? 0 : 1;
  });
}

}  // namespace tilemoe::cli
