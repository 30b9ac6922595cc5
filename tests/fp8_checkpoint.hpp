#pragma once
// A small FP8 checkpoint as DeepSeek-V3/R1 ship theirs: routed-expert weights in F8_E4M3, each
// with an F32 `<name>_scale_inv` holding one scale per block of quantization_config's
// weight_block_size ([128, 128]). The shapes here are no multiple of 128, so the last block of
// each row and column of blocks is partial.
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "src/io/safetensors_writer.hpp"
#include "tilemoe/config.hpp"

namespace tilemoe::test {

struct Fp8Options {
  int block_rows = 128, block_cols = 128;
  bool block_in_config = true;  // false: config.json has no quantization_config (128 x 128 is assumed)
  bool drop_one_scale = false;  // layer 1 expert 1 up has no _scale_inv
  std::vector<std::int64_t> gate_scale_shape;  // when set: layer 1 expert 0 gate's scale has this shape
  int nan_code_at = -1;         // when >= 0: this element of layer 1 expert 0 up is 0x7f (NaN)
};

struct Fp8Checkpoint {
  std::string dir;
  MoeShape shape{200, 300, 2, 1};
  int layer = 1;
  Fp8Options opt;
  // [projection][expert]: the stored codes and scales
  std::vector<std::uint8_t> codes[3][2];
  std::vector<float> scale_inv[3][2];

  std::string weight_name(Projection p, int e) const {
    static const char* names[] = {"gate_proj", "up_proj", "down_proj"};
    return "model.layers.1.mlp.experts." + std::to_string(e) + "." + names[static_cast<int>(p)] + ".weight";
  }
  int scale_rows(Projection p) const { return (projection_out(shape, p) + opt.block_rows - 1) / opt.block_rows; }
  int scale_cols(Projection p) const { return (projection_in(shape, p) + opt.block_cols - 1) / opt.block_cols; }
};

inline Fp8Checkpoint write_fp8_checkpoint(const std::string& dir, const Fp8Options& opt = {}) {
  Fp8Checkpoint ck;
  ck.dir = dir;
  ck.opt = opt;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::string quant = opt.block_in_config ? R"(, "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
      "weight_block_size": [)" + std::to_string(opt.block_rows) + ", " + std::to_string(opt.block_cols) + "]}"
                                          : std::string();
  std::ofstream(dir + "/config.json") << R"({"model_type": "deepseek_v3", "hidden_size": 200, "moe_intermediate_size": 300,
    "n_routed_experts": 2, "num_experts_per_tok": 1, "num_hidden_layers": 2, "first_k_dense_replace": 1, "moe_layer_freq": 1,
    "n_group": 1, "topk_group": 1)" + quant + "}";
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(1e-3f, 1e-2f);
  io::SafetensorsWriter w;
  for (Projection p : kProjections)
    for (int e = 0; e < 2; ++e) {
      const int rows = projection_out(ck.shape, p), cols = projection_in(ck.shape, p);
      auto& c = ck.codes[static_cast<int>(p)][e];
      c.resize(static_cast<std::size_t>(rows) * cols);
      for (auto& v : c) {
        do v = static_cast<std::uint8_t>(byte(rng));
        while ((v & 0x7f) == 0x7f);  // 0x7f and 0xff are NaN in e4m3fn
      }
      if (opt.nan_code_at >= 0 && p == Projection::up && e == 0) c[opt.nan_code_at] = 0x7f;
      auto& s = ck.scale_inv[static_cast<int>(p)][e];
      std::vector<std::int64_t> sshape{ck.scale_rows(p), ck.scale_cols(p)};
      if (!opt.gate_scale_shape.empty() && p == Projection::gate && e == 0) sshape = opt.gate_scale_shape;
      std::size_t count = 1;
      for (std::int64_t d : sshape) count *= static_cast<std::size_t>(d);
      s.resize(count);
      for (auto& v : s) v = scale(rng);
      const std::string name = ck.weight_name(p, e);
      w.add(name, io::Dtype::F8_E4M3, {rows, cols}, c.data());
      if (!(opt.drop_one_scale && p == Projection::up && e == 1)) w.add_f32(name + "_scale_inv", sshape, s);
    }
  std::vector<float> router(static_cast<std::size_t>(2) * 200, 0.01f), bias{0.5f, -0.5f};
  w.add_f32("model.layers.1.mlp.gate.weight", {2, 200}, router);
  w.add_f32("model.layers.1.mlp.gate.e_score_correction_bias", {2}, bias);
  w.write(dir + "/model.safetensors");
  return ck;
}

}  // namespace tilemoe::test
