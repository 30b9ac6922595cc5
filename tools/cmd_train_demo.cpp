// `tilemoe train-demo`: LoRA fine-tuning of a synthetic layer with plain SGD on the runtime's
// gradients. A "teacher" LoRA defines the target outputs; a student LoRA, initialised as PEFT
// does (A random, B zero), learns it. The student's arrays are the layer's LoRA weights (zero
// copy): the SGD step writes them in place and the next forward sees it without any call.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>

#include "src/layer/moe_compute.hpp"
#include "src/layer/moe_sft_layer.hpp"
#include "src/layer/synthetic_layer.hpp"
#include "tilemoe/error.hpp"
#include "tools/cli_common.hpp"

namespace tilemoe::cli {
namespace {

struct TrainBatch {
  RandomRouting routing;
  std::vector<bf16> x;
  std::vector<float> target;
};

// 0.5 * mean over tokens of |out - target|^2, and its gradient with respect to out.
double mse_loss(const std::vector<float>& out, const std::vector<float>& target, int tokens, std::vector<float>& grad) {
  double loss = 0;
  for (std::size_t i = 0; i < out.size(); ++i) {
    const double d = static_cast<double>(out[i]) - target[i];
    loss += 0.5 * d * d / tokens;
    grad[i] = static_cast<float>(d / tokens);
  }
  return loss;
}

}  // namespace

void add_train_demo_command(CLI::App& app, int& status) {
  struct Args {
    std::string shape = "mini", isa = "auto";
    int tokens = 64, steps = 300, rank = 8, threads = 0, batches = 4;
    float lr = 0.5f;
    std::uint64_t seed = 1;
  };
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("train-demo", "SGD steps on a synthetic layer whose LoRA learns a target delta; prints the loss falling");
  cmd->add_option("--shape", a->shape, "mini, v2-lite, qwen3-30b, v3, mixtral-8x7b, v4-flash or gpt-oss-120b")->capture_default_str();
  cmd->add_option("--tokens", a->tokens, "Tokens per batch")->capture_default_str()->check(CLI::Range(1, 1 << 16));
  cmd->add_option("--batches", a->batches, "Distinct batches, used in turn")->capture_default_str()->check(CLI::Range(1, 1024));
  cmd->add_option("--steps", a->steps, "SGD steps")->capture_default_str()->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--lora-rank", a->rank, "LoRA rank of the student and the teacher")->capture_default_str()->check(CLI::Range(1, 256));
  cmd->add_option("--lr", a->lr, "Learning rate")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--isa", a->isa, "portable, avx2, avx512, amx or auto")->capture_default_str();
  cmd->add_option("--threads", a->threads, "Worker threads (0: every core)")->capture_default_str()->check(CLI::NonNegativeNumber);
  cmd->add_option("--seed", a->seed, "Random seed")->capture_default_str();
  cmd->callback([a, &status] {
    const MoeShape s = shape_by_name(a->shape);
    const std::string backend = resolve_backend(a->isa);
    if (backend == "reference") fail(ErrorKind::invalid_argument, "train-demo runs the kernels; --isa reference is not one");
    numa::ThreadPool& pool = pool_for_threads(a->threads);
    ExpertWeights w = random_expert_weights(s, a->seed, &pool);
    PackedExpertWeights packed = PackedExpertWeights::pack(w.view(), pool);
    const float alpha = 2.0f * a->rank;

    // The teacher: a LoRA delta large enough to matter, whose outputs are the targets.
    LayerLora teacher = random_lora(s, a->rank, alpha, a->seed + 1);
    for (auto& p : teacher.proj)
      for (auto& v : p.b) v *= 4.0f;
    MoeSftLayer layer(packed, *kernels::parse_isa(backend), pool, {a->tokens, 1, a->rank}, lora_view(teacher));
    std::vector<TrainBatch> batches(static_cast<std::size_t>(a->batches));
    const std::size_t n = static_cast<std::size_t>(a->tokens) * s.hidden;
    for (int b = 0; b < a->batches; ++b) {
      auto& tb = batches[b];
      tb.routing = random_routing(a->tokens, s, a->seed + 100 + b);
      auto x = random_activations(n, a->seed + 200 + b);
      tb.x = to_bf16(x.data(), n);
      tb.target.resize(n);
      layer.forward_sft(a->tokens, s.top_k, tb.x.data(), tb.routing.expert_ids.data(), tb.routing.weights.data(), tb.target.data(), false);
    }

    // The student, PEFT-initialised; from here on the layer reads its arrays in place.
    LayerLora student = random_lora(s, a->rank, alpha, a->seed + 2);
    for (auto& p : student.proj) std::fill(p.b.begin(), p.b.end(), 0.0f);
    layer.update_lora_weights(lora_view(student));
    LayerLora grads = student.zeros_like();
    std::printf("tilemoe train-demo: shape %s (hidden %d, intermediate %d, %d experts, top-%d), LoRA r=%d on gate/up/down, %d tokens x %d "
                "batches, SGD lr %g, %s, %d threads\n",
                a->shape.c_str(), s.hidden, s.intermediate, s.num_experts, s.top_k, a->rank, a->tokens, a->batches, a->lr,
                backend.c_str(), pool.size());

    std::vector<float> out(n), grad_out(n), grad_in(n);
    double first = 0, last = 0, step_seconds = 0;
    const int report_every = std::max(1, a->steps / 15);
    for (int step = 0; step < a->steps; ++step) {
      const TrainBatch& tb = batches[static_cast<std::size_t>(step % a->batches)];
      auto t0 = std::chrono::steady_clock::now();
      layer.forward_sft(a->tokens, s.top_k, tb.x.data(), tb.routing.expert_ids.data(), tb.routing.weights.data(), out.data(), true);
      const double loss = mse_loss(out, tb.target, a->tokens, grad_out);
      layer.backward(grad_out.data(), grad_in.data(), lora_grad_view(grads));
      for (int p = 0; p < 3; ++p) {
        auto& l = student.proj[p];
        const auto& g = grads.proj[p];
        for (std::size_t i = 0; i < l.a.size(); ++i) l.a[i] -= a->lr * g.a[i];
        for (std::size_t i = 0; i < l.b.size(); ++i) l.b[i] -= a->lr * g.b[i];
      }
      step_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (!std::isfinite(loss)) fail(ErrorKind::state, "train-demo: the loss is not finite at step " + std::to_string(step) + "; lower --lr");
      if (step == 0) first = loss;
      last = loss;
      if (step % report_every == 0 || step == a->steps - 1) {
        const int bar = static_cast<int>(30.0 * loss / first + 0.5);
        std::printf("  step %5d  loss %.4e  %s\n", step, loss, std::string(static_cast<std::size_t>(std::clamp(bar, 0, 60)), '#').c_str());
        std::fflush(stdout);
      }
    }
    std::printf("loss %.4e -> %.4e (%.1fx lower) in %d steps, %.2f ms per step (forward_sft + backward + SGD)\n", first, last,
                first / last, a->steps, step_seconds * 1e3 / a->steps);
    status = last < first ? 0 : 1;
    if (status) std::printf("FAILED: the loss did not fall\n");
  });
}

}  // namespace tilemoe::cli
