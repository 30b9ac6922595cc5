#pragma once
// `tilemoe bench`'s layer timing: cases (LoRA rank x factor type x node count x int4 group size x
// AMX one-row tile block)
// with layers of their own, taking turns call by call over fresh routings, each reported against
// the machine's measured limits (the floor), and the optional oneDNN baseline.
#include <string>
#include <vector>

#include "amx/isa.hpp"
#include "amx/one_row_tile_block.hpp"
#include "tilemoe/config.hpp"

namespace tilemoe::cli {

// What `tilemoe bench` was asked for, parsed (cmd_bench.cpp).
struct LayerBenchOptions {
  std::string shape_name, weights_name;
  MoeShape shape;
  kernels::Isa isa = kernels::Isa::portable;
  WeightType weight_type = WeightType::bf16;
  std::vector<int> tokens, ranks, node_counts, group_sizes;
  std::vector<bool> lora_bf16;  // per entry: the factors stored as bf16 (else f32)
  std::vector<kernels::OneRowTileBlock> one_row_blocks;  // set before each call of a case
  int threads = 0;              // 0: every core
  int layers = 0;               // 0: enough to exceed 4x the last-level cache
  double iter_scale = 1.0;
  bool json = false, phases = false, backward = false, grad_overwrite = false, weight_copy = false, lora_held = false, onednn = false;
};

void run_layer_bench(const LayerBenchOptions& o);

}  // namespace tilemoe::cli
