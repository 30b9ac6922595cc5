// How a hybrid CPU-GPU server embeds tilemoe: the experts of every MoE layer live in the server's
// own buffers; per layer it submits the routed experts to the CPU, does its own work meanwhile
// (attention and shared experts on the GPU; here, a stand-in on this thread), then syncs and
// adds the experts' output. A trainer does the same with forward_sft and backward.
//
// Built and run by the tests: it checks that the overlapped run gives the synchronous results.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "tilemoe/error.hpp"
#include "tilemoe/moe_layer.hpp"

namespace {

constexpr int kLayers = 3, kExperts = 16, kTopK = 4, kHidden = 256, kInter = 176, kTokens = 32, kRank = 8;

struct ServerLayer {  // what the server owns for one MoE layer
  std::vector<tilemoe::bf16> gate, up, down;
  std::vector<float> lora_a, lora_b;  // down projection's LoRA only, to show a partial set
};

std::vector<tilemoe::bf16> random_bf16(std::size_t n, float scale, std::mt19937& rng) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<tilemoe::bf16> v(n);
  for (auto& x : v) x = tilemoe::float_to_bf16(d(rng));
  return v;
}

// The router's choice, as the GPU would send it: k distinct experts, softmax-like weights.
void route(std::mt19937& rng, std::vector<std::int64_t>& ids, std::vector<float>& weights) {
  for (int t = 0; t < kTokens; ++t) {
    std::vector<int> all(kExperts);
    for (int e = 0; e < kExperts; ++e) all[e] = e;
    std::shuffle(all.begin(), all.end(), rng);
    float sum = 0;
    for (int j = 0; j < kTopK; ++j) {
      ids[t * kTopK + j] = all[j];
      sum += weights[t * kTopK + j] = 1.0f + static_cast<float>(j);
    }
    for (int j = 0; j < kTopK; ++j) weights[t * kTopK + j] /= sum;
  }
}

// Stand-in for the GPU's attention: it updates the hidden state the next layer reads.
void attention_stand_in(std::vector<float>& residual) {
  for (float& v : residual) v = std::tanh(v) * 1.5f;
}

// One decode/prefill pass through every layer: returns the final residual stream.
std::vector<float> run_model(std::vector<tilemoe::MoeLayer>& layers, tilemoe::Runtime& rt, bool overlap, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> residual(static_cast<std::size_t>(kTokens) * kHidden);
  for (float& v : residual) v = d(rng);
  std::vector<tilemoe::bf16> x(residual.size());
  std::vector<float> experts_out(residual.size());
  std::vector<std::int64_t> ids(kTokens * kTopK);
  std::vector<float> weights(kTokens * kTopK);
  for (auto& layer : layers) {
    for (std::size_t i = 0; i < residual.size(); ++i) x[i] = tilemoe::float_to_bf16(residual[i]);
    route(rng, ids, weights);
    if (overlap) {
      layer.submit_forward(kTokens, kTopK, x.data(), ids.data(), weights.data(), experts_out.data());
      attention_stand_in(residual);  // runs while the CPU experts do
      rt.sync();
    } else {
      layer.forward(kTokens, kTopK, x.data(), ids.data(), weights.data(), experts_out.data());
      attention_stand_in(residual);
    }
    for (std::size_t i = 0; i < residual.size(); ++i) residual[i] += experts_out[i];
  }
  return residual;
}

}  // namespace

int main() {
  try {
    std::mt19937 rng(7);
    std::vector<ServerLayer> owned(kLayers);
    const std::size_t per = static_cast<std::size_t>(kExperts) * kInter * kHidden;
    for (auto& l : owned) {
      l.gate = random_bf16(per, 1.0f / std::sqrt(float(kHidden)), rng);
      l.up = random_bf16(per, 1.0f / std::sqrt(float(kHidden)), rng);
      l.down = random_bf16(per, 1.0f / std::sqrt(float(kInter)), rng);
      l.lora_a.assign(static_cast<std::size_t>(kExperts) * kRank * kInter, 0.01f);
      l.lora_b.assign(static_cast<std::size_t>(kExperts) * kHidden * kRank, 0.02f);
    }

    tilemoe::Runtime rt;  // every core, the best ISA
    tilemoe::MoeLayerConfig cfg;
    cfg.num_experts = kExperts;
    cfg.top_k = kTopK;
    cfg.hidden = kHidden;
    cfg.intermediate = kInter;
    cfg.max_tokens = kTokens;
    cfg.lora_rank = kRank;
    cfg.lora_alpha = 16;
    std::vector<tilemoe::MoeLayer> layers;
    for (auto& l : owned) {
      layers.emplace_back(rt, cfg, tilemoe::ExpertWeightsRef{l.gate.data(), l.up.data(), l.down.data()});
      tilemoe::LoraWeights lw;
      lw.down_a = l.lora_a.data();
      lw.down_b = l.lora_b.data();
      layers.back().update_lora_weights(lw);  // the server's LoRA memory, read in place
    }

    run_model(layers, rt, false, 0);  // the first call grows the layers' buffers: keep it out of the timing
    constexpr int kPasses = 20;
    std::vector<float> sync_result, async_result;
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kPasses; ++i) sync_result = run_model(layers, rt, false, 1);
    auto t1 = std::chrono::steady_clock::now();
    for (int i = 0; i < kPasses; ++i) async_result = run_model(layers, rt, true, 1);
    auto t2 = std::chrono::steady_clock::now();
    auto us = [](auto a, auto b) { return std::chrono::duration<double, std::micro>(b - a).count() / (kPasses * kLayers); };
    std::printf("%d tokens per layer on %s with %d threads, per layer: synchronous %.1f us, submit + sync %.1f us\n", kTokens,
                rt.isa(), rt.threads(), us(t0, t1), us(t1, t2));
    if (sync_result != async_result) {
      std::fprintf(stderr, "overlapped run differs from the synchronous one\n");
      return 1;
    }
    std::printf("overlapped results equal the synchronous ones\n");

    // Bad input is an exception naming the problem; the layer stays usable.
    std::vector<tilemoe::bf16> x(static_cast<std::size_t>(kTokens) * kHidden);
    std::vector<std::int64_t> ids(kTokens * kTopK, kExperts);  // out of range
    std::vector<float> weights(kTokens * kTopK, 0.25f), out(x.size());
    try {
      layers[0].forward(kTokens, kTopK, x.data(), ids.data(), weights.data(), out.data());
      std::fprintf(stderr, "an out-of-range expert id was accepted\n");
      return 1;
    } catch (const tilemoe::Error& e) {
      std::printf("bad routing rejected: %s\n", e.what());
    }
    return 0;
  } catch (const tilemoe::Error& e) {
    std::fprintf(stderr, "tilemoe error: %s\n", e.what());
    return 1;
  }
}
