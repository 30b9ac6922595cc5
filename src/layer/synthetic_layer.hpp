#pragma once
// Random layers of real models' shapes, for the demo, the bench and tests: weights scaled like
// a trained model's (std ~ 1/sqrt(fan_in)) so activations stay in a realistic range.
#include <cstdint>
#include <string>
#include <vector>

#include "src/lora/lora_weights.hpp"
#include "numa/thread_pool.hpp"
#include "src/model/expert_weights.hpp"

namespace tilemoe {

struct NamedShape {
  const char* name;
  MoeShape shape;
};
// v2-lite, qwen3-30b, v3, mixtral-8x7b, v4-flash (a swiglu_limit), gpt-oss-120b (gpt-oss's SwiGLU,
// with biases), and mini (a small layer for demos)
const std::vector<NamedShape>& known_shapes();
MoeShape shape_by_name(const std::string& name);  // throws invalid_argument listing the names

// With a pool the weights are made in parallel; the values do not depend on the pool. A shape in
// gpt-oss's SwiGLU form (swiglu_alpha or swiglu_up_offset) gets random biases too, as gpt-oss has.
ExpertWeights random_expert_weights(const MoeShape& shape, std::uint64_t seed, numa::ThreadPool* pool = nullptr);
// Rank `rank` on all three projections of every expert (or only experts with e % every == 0).
LayerLora random_lora(const MoeShape& shape, int rank, float alpha, std::uint64_t seed, int every = 1);

struct RandomRouting {
  std::vector<std::int64_t> expert_ids;  // [T][k], k distinct experts per token
  std::vector<float> weights;            // [T][k], softmax-like positive weights
};
RandomRouting random_routing(int tokens, const MoeShape& shape, std::uint64_t seed);
std::vector<float> random_activations(std::size_t count, std::uint64_t seed, float scale = 1.0f);

}  // namespace tilemoe
