#include "src/layer/synthetic_layer.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "tilemoe/error.hpp"

namespace tilemoe {
namespace {

// splitmix64: fast, seedable, identical everywhere (std distributions are not portable).
struct Rng {
  std::uint64_t s;
  std::uint64_t next() {
    std::uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  float uniform() { return static_cast<float>(next() >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f; }  // [-1, 1)
};

// Chunks with their own seeds, so the values are the same however many threads fill them.
void fill_bf16(std::vector<bf16>& v, std::size_t n, float scale, std::uint64_t seed, numa::ThreadPool* pool) {
  v.resize(n);
  const std::size_t chunk = std::size_t(1) << 20;
  auto fill_chunk = [&](std::size_t c, int) {
    Rng r{seed * 0x100000001b3ull + c};
    std::size_t end = std::min(n, (c + 1) * chunk);
    for (std::size_t i = c * chunk; i < end; ++i) v[i] = float_to_bf16(r.uniform() * scale);
  };
  std::size_t chunks = (n + chunk - 1) / chunk;
  if (pool) pool->parallel_for(chunks, fill_chunk);
  else
    for (std::size_t c = 0; c < chunks; ++c) fill_chunk(c, 0);
}

}  // namespace

const std::vector<NamedShape>& known_shapes() {
  static const std::vector<NamedShape> shapes = {
      {"v2-lite", {2048, 1408, 64, 6}},
      {"qwen3-30b", {2048, 768, 128, 8}},
      {"v3", {7168, 2048, 256, 8}},
      {"mixtral-8x7b", {4096, 14336, 8, 2}},
      {"v4-flash", {4096, 2048, 256, 6, 10.0f}},  // DeepSeek-V4-Flash: clamped SwiGLU at swiglu_limit 10
      {"gpt-oss-120b", {2880, 2880, 128, 4, 7.0f, 1.702f, 1.0f}},  // gpt-oss's SwiGLU, and biases
      {"mini", {512, 384, 16, 4}},  // not a model: small enough that train-demo runs in seconds anywhere
  };
  return shapes;
}

MoeShape shape_by_name(const std::string& name) {
  std::string names;
  for (const auto& s : known_shapes()) {
    if (name == s.name) return s.shape;
    names += std::string(names.empty() ? "" : ", ") + s.name;
  }
  fail(ErrorKind::invalid_argument, "unknown shape '" + name + "' (known: " + names + ")");
}

ExpertWeights random_expert_weights(const MoeShape& s, std::uint64_t seed, numa::ThreadPool* pool) {
  ExpertWeights w;
  w.shape = s;
  std::size_t n = static_cast<std::size_t>(s.num_experts) * s.hidden * s.intermediate;
  // uniform[-a, a] has std a/sqrt(3): a = sqrt(3/fan_in) gives std 1/sqrt(fan_in).
  fill_bf16(w.gate, n, std::sqrt(3.0f / s.hidden), seed * 3 + 1, pool);
  fill_bf16(w.up, n, std::sqrt(3.0f / s.hidden), seed * 3 + 2, pool);
  fill_bf16(w.down, n, std::sqrt(3.0f / s.intermediate), seed * 3 + 3, pool);
  if (s.swiglu_alpha != 1.0f || s.swiglu_up_offset != 0.0f) {
    // gpt-oss's form comes with biases: gate's and up's about as large as the products.
    const std::size_t ei = static_cast<std::size_t>(s.num_experts) * s.intermediate;
    fill_bf16(w.gate_bias, ei, 0.5f, seed * 7 + 4, pool);
    fill_bf16(w.up_bias, ei, 0.5f, seed * 7 + 5, pool);
    fill_bf16(w.down_bias, static_cast<std::size_t>(s.num_experts) * s.hidden, 0.1f, seed * 7 + 6, pool);
  }
  return w;
}

LayerLora random_lora(const MoeShape& s, int rank, float alpha, std::uint64_t seed, int every) {
  LayerLora l;
  if (rank <= 0) return l;
  Rng r{seed};
  for (Projection p : kProjections) {
    auto& proj = l[p];
    proj.allocate(s.num_experts, rank, projection_in(s, p), projection_out(s, p));
    float a_scale = std::sqrt(3.0f / proj.in), b_scale = 0.05f;  // trained B is small but non-zero
    for (int e = 0; e < s.num_experts; ++e) {
      if (e % every != 0) continue;
      proj.present[e] = 1;
      proj.scale[e] = alpha / rank;
      proj.expert_rank[e] = rank;
      // LoRA weights are bf16 in real adapters: keep them bf16-representable.
      for (std::size_t i = 0; i < static_cast<std::size_t>(rank) * proj.in; ++i)
        proj.a_of(e)[i] = bf16_to_float(float_to_bf16(r.uniform() * a_scale));
      for (std::size_t i = 0; i < static_cast<std::size_t>(rank) * proj.out; ++i)
        proj.b_of(e)[i] = bf16_to_float(float_to_bf16(r.uniform() * b_scale));
    }
  }
  return l;
}

RandomRouting random_routing(int tokens, const MoeShape& s, std::uint64_t seed) {
  RandomRouting rr;
  Rng r{seed};
  std::vector<int> perm(s.num_experts);
  for (int t = 0; t < tokens; ++t) {
    std::iota(perm.begin(), perm.end(), 0);
    float sum = 0;
    std::vector<float> w(s.top_k);
    for (int j = 0; j < s.top_k; ++j) {  // partial Fisher-Yates: k distinct experts
      int pick = j + static_cast<int>(r.next() % static_cast<std::uint64_t>(s.num_experts - j));
      std::swap(perm[j], perm[pick]);
      rr.expert_ids.push_back(perm[j]);
      w[j] = std::exp(r.uniform());
      sum += w[j];
    }
    for (float x : w) rr.weights.push_back(x / sum);
  }
  return rr;
}

std::vector<float> random_activations(std::size_t count, std::uint64_t seed, float scale) {
  std::vector<float> v(count);
  Rng r{seed};
  for (auto& x : v) x = bf16_to_float(float_to_bf16(r.uniform() * scale));
  return v;
}

}  // namespace tilemoe
