#pragma once
// Every layer of every PyTorch + PEFT fixture case, loaded as the kernel grids read it: the
// checkpoint's experts, the adapter's LoRA, and the layer's inputs in reference.safetensors.
#include "catch.hpp"
#include "fixture_cases.hpp"
#include "src/io/safetensors.hpp"
#include "src/lora/peft_adapter.hpp"
#include "src/model/checkpoint.hpp"

namespace tilemoe::test {

struct FixtureLayer {
  const ModelConfig& config;
  const io::SafetensorsFile& ref;  // PyTorch's results: in.expected(ref, "output"), ...
  const ExpertWeights& experts;
  const LoadedLora& lora;
  const FixtureLayerInputs& in;
};

// fn(const FixtureLayer&) for each layer, its checks tagged with the case's name and the layer.
template <typename Fn>
void for_each_fixture_layer(Fn&& fn) {
  int visited = 0;
  for (const FixtureCase& c : fixture_cases()) {
    const Checkpoint ck = Checkpoint::open(c.dir + "/model");
    const io::SafetensorsFile ref = io::SafetensorsFile::open(c.dir + "/reference.safetensors");
    for (int layer : c.layers) {
      const ExpertWeights experts = ck.load_layer_experts(layer);
      const LoadedLora lora = load_layer_lora(c.dir + "/adapter", ck.config(), layer);
      const FixtureLayerInputs in = read_fixture_layer(ref, layer);
      INFO(c.name << " layer " << layer);
      fn(FixtureLayer{ck.config(), ref, experts, lora, in});
      ++visited;
    }
  }
  CHECK(visited >= 3);  // a case list or layer list read as empty would check nothing
}

}  // namespace tilemoe::test
