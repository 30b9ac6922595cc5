#pragma once
// Whether two PEFT adapter directories hold the same adapter, for the export round-trip tests.
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "catch.hpp"
#include "src/io/safetensors.hpp"
#include "src/lora/peft_adapter.hpp"

namespace tilemoe::test {

inline std::string file_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// adapter_config.json byte for byte; adapter_model.safetensors tensor by tensor (same keys,
// dtypes, shapes and bits) with the same file metadata.
inline void check_same_adapter(const std::string& want_dir, const std::string& got_dir) {
  INFO(want_dir << " vs " << got_dir);
  CHECK(file_text(got_dir + "/adapter_config.json") == file_text(want_dir + "/adapter_config.json"));
  auto want = io::SafetensorsFile::open(want_dir + "/adapter_model.safetensors");
  auto got = io::SafetensorsFile::open(got_dir + "/adapter_model.safetensors");
  CHECK(got.metadata() == want.metadata());
  REQUIRE(got.tensors().size() == want.tensors().size());
  for (std::size_t i = 0; i < want.tensors().size(); ++i) {
    const auto& w = want.tensors()[i];
    const auto& g = got.tensors()[i];
    INFO(w.name);
    REQUIRE(g.name == w.name);
    REQUIRE(g.dtype == w.dtype);
    REQUIRE(g.shape == w.shape);
    REQUIRE(std::memcmp(got.data(g), want.data(w), w.nbytes) == 0);
  }
}

// Both adapters load into the same LoRA (values, ranks, scales, coverage, PEFT names, dtypes, and
// for LoRA stacked over the experts its stacked keys and rows).
inline void check_same_loaded_lora(const std::string& want_dir, const std::string& got_dir, const ModelConfig& model,
                                   const std::vector<int>& layers) {
  for (int layer : layers) {
    INFO("layer " << layer);
    LoadedLora want = load_layer_lora(want_dir, model, layer), got = load_layer_lora(got_dir, model, layer);
    for (Projection p : kProjections) {
      INFO(projection_name(p));
      const auto &w = want.lora[p], &g = got.lora[p];
      CHECK(g.rank == w.rank);
      CHECK(g.a == w.a);
      CHECK(g.b == w.b);
      CHECK(g.scale == w.scale);
      CHECK(g.present == w.present);
      CHECK(g.expert_rank == w.expert_rank);
      CHECK(got.key_template_a == want.key_template_a);
      CHECK(got.key_template_b == want.key_template_b);
      CHECK(got.dtype_a == want.dtype_a);
      CHECK(got.dtype_b == want.dtype_b);
      const auto &gs = got.stacked[static_cast<int>(p)], &ws = want.stacked[static_cast<int>(p)];
      CHECK(gs.key_a == ws.key_a);
      CHECK(gs.key_b == ws.key_b);
      CHECK(gs.first_row == ws.first_row);
      CHECK(gs.b_rows == ws.b_rows);
      CHECK(gs.dtype_a == ws.dtype_a);
      CHECK(gs.dtype_b == ws.dtype_b);
    }
  }
}

}  // namespace tilemoe::test
