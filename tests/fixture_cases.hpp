#pragma once
// The PyTorch + PEFT reference cases in tests/data (copied from shared/fixtures).
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "catch.hpp"
#include "src/io/safetensors.hpp"
#include "src/lora/peft_adapter.hpp"
#include "test_util.hpp"

namespace tilemoe::test {

struct FixtureCase {
  std::string name, dir;
  std::vector<int> layers;
  int rank = 0;
};

// One MoE layer's inputs in a case's reference.safetensors (`layer_L.*`).
struct FixtureLayerInputs {
  std::string prefix;  // "layer_L."
  int tokens = 0, top_k = 0;
  std::vector<float> input;          // [T][H], the values stored (bf16, or f32 for f32 checkpoints)
  std::vector<bf16> input_bf16;      // the same rounded to bf16, what the kernels take
  std::vector<std::int64_t> expert_ids;
  std::vector<float> weights, grad_output;

  // A stored result of this layer, e.g. "output" or "grad_input".
  std::vector<float> expected(const io::SafetensorsFile& ref, const std::string& key) const {
    return io::read_as_f32(ref, prefix + key);
  }
};

inline FixtureLayerInputs read_fixture_layer(const io::SafetensorsFile& ref, int layer) {
  FixtureLayerInputs in;
  in.prefix = "layer_" + std::to_string(layer) + ".";
  in.tokens = static_cast<int>(ref.get(in.prefix + "input").shape[0]);
  in.top_k = static_cast<int>(ref.get(in.prefix + "expert_ids").shape[1]);
  in.input = io::read_as_f32(ref, in.prefix + "input");
  in.input_bf16 = io::read_as_bf16(ref, in.prefix + "input");
  in.expert_ids = io::read_as_i64(ref, in.prefix + "expert_ids");
  in.weights = io::read_as_f32(ref, in.prefix + "weights");
  in.grad_output = io::read_as_f32(ref, in.prefix + "grad_output");
  return in;
}

inline std::vector<FixtureCase> fixture_cases() {
  std::vector<FixtureCase> out;
  for (const char* name : {"deepseek_tiny", "mixtral_tiny", "original_moe_tiny"}) {
    FixtureCase c;
    c.name = name;
    c.dir = data_dir() + "/" + name;
    std::ifstream in(c.dir + "/case.json");
    auto j = nlohmann::json::parse(in);
    c.layers = j["spec"]["layers"].get<std::vector<int>>();
    c.rank = j["spec"]["rank"].get<int>();
    out.push_back(c);
  }
  return out;
}

// Every LoRA gradient against PyTorch's `grad.<PEFT key>` (norm-wise, 2e-2), each at the expert's
// own rank (rank_pattern pads smaller ranks with zeros); experts no token reached have no key
// there and must have an all-zero gradient. Returns how many gradient pairs were compared.
inline int check_fixture_lora_grads(const LayerLora& grads, const LoadedLora& lora, const io::SafetensorsFile& ref, int num_experts) {
  int checked = 0;
  for (Projection proj : kProjections) {
    const auto& g = grads[proj];
    for (int e = 0; e < num_experts && g.rank > 0; ++e) {
      if (!g.present[e]) continue;
      const int r = g.expert_rank[e];
      std::vector<float> ga(g.a_of(e), g.a_of(e) + static_cast<std::size_t>(r) * g.in), gb;
      for (int o = 0; o < g.out; ++o)
        for (int q = 0; q < r; ++q) gb.push_back(g.b_of(e)[static_cast<std::size_t>(o) * g.rank + q]);
      const std::string ka = "grad." + lora.key_a(proj, e), kb = "grad." + lora.key_b(proj, e);
      INFO(ka);
      if (ref.find(ka)) {
        CHECK(rel_error(ga, io::read_as_f32(ref, ka)) <= 2e-2);
        CHECK(rel_error(gb, io::read_as_f32(ref, kb)) <= 2e-2);
        ++checked;
      } else {
        for (float v : ga) REQUIRE(v == 0.0f);
        for (float v : gb) REQUIRE(v == 0.0f);
      }
    }
  }
  CHECK(checked > 0);
  return checked;
}

}  // namespace tilemoe::test
