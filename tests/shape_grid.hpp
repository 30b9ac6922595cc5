#pragma once
// The awkward shapes every fast path is checked on against the reference: hidden and
// intermediate sizes off every tile multiple, 1 to 1024 tokens, top-k 1 to 8, LoRA rank 0 to 64,
// LoRA on only some experts, experts with no tokens, and decode-sized experts (1 to 3 rows)
// next to larger ones; some with a swiglu_limit, some in gpt-oss's form with biases.
#include <algorithm>
#include <vector>

#include "src/layer/synthetic_layer.hpp"
#include "tilemoe/config.hpp"

namespace tilemoe::test {

struct GridCase {
  MoeShape shape;
  int tokens, rank, lora_every;
};

inline const std::vector<GridCase>& awkward_shape_grid() {
  static const std::vector<GridCase> cases = {
      {{40, 24, 4, 2}, 1, 0, 1},     {{40, 24, 4, 2}, 3, 1, 1},      {{33, 47, 5, 3}, 17, 5, 2},   {{64, 100, 3, 1}, 64, 16, 1},
      {{17, 200, 8, 8}, 9, 64, 3},   {{100, 33, 6, 4}, 200, 33, 2},  {{48, 31, 16, 6}, 1024, 8, 1},
      {{320, 176, 8, 2}, 13, 8, 1},  {{256, 320, 4, 2}, 129, 16, 1}, {{31, 15, 2, 2}, 2, 2, 1},
      {{128, 96, 12, 8}, 40, 0, 1},  {{80, 48, 4, 2}, 70, 17, 1},    {{300, 200, 8, 2}, 3, 16, 1},
      {{300, 200, 8, 2}, 30, 16, 2},
      // A swiglu_limit (DeepSeek-V4's clamped SwiGLU) that clamps about a third of the gates and
      // ups of these random layers: few-row experts, tile-sized ones, and decode.
      {{33, 47, 5, 3, 0.5f}, 17, 5, 2},  {{100, 33, 6, 4, 0.5f}, 200, 16, 2}, {{48, 31, 16, 6, 0.3f}, 1, 8, 1},
      // gpt-oss's SwiGLU (alpha 1.702, up + 1) with the experts' biases (random_expert_weights), clamped
      // as above or not: few-row experts, tile-sized ones, decode.
      {{33, 47, 5, 3, 0.5f, 1.702f, 1.0f}, 17, 5, 2}, {{100, 33, 6, 4, 0.5f, 1.702f, 1.0f}, 200, 16, 2},
      {{48, 31, 16, 6, 0.0f, 1.702f, 1.0f}, 1, 8, 1}, {{64, 100, 3, 1, 0.0f, 1.702f, 1.0f}, 64, 16, 1},
  };
  return cases;
}

// The shape a backward grid runs a case at. The clamp of a swiglu_limit makes the gradient jump at
// its bounds: a gate or up within the paths' rounding of a bound (the fast path's LoRA term is
// about 1e-3 off the reference's in f32, from bf16 intermediates) may be clamped on one path and
// not on the other, and that element's whole gradient then differs. The backward grids move the
// bound out into the tail (a few per cent of these values beyond it), where few lie near it; the
// forward, continuous there, keeps the grid's limit. Exact masks are the kernel grid's to check.
inline MoeShape backward_shape(MoeShape s) {
  s.swiglu_limit *= 4.0f;
  return s;
}

// Ranks of their own for gate, up and down (PEFT's rank_pattern), some with no LoRA on one of gate
// and up, and a LoRA on every expert at those ranks.
inline const int kProjectionRanks[][3] = {{6, 11, 16}, {16, 16, 5}, {32, 17, 3}, {2, 64, 1}, {0, 16, 8}, {16, 0, 0}, {33, 48, 0}};

inline LayerLora projection_ranks_lora(const MoeShape& s, const int (&ranks)[3]) {
  LayerLora lora;
  for (Projection p : kProjections) {
    const int rank = ranks[static_cast<int>(p)];
    lora[p] = random_lora(s, rank, 2.0f * std::max(rank, 1), 40 + rank, 1)[p];
  }
  return lora;
}

}  // namespace tilemoe::test
