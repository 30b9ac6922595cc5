#pragma once
// The awkward shapes every fast path is checked on against the reference: hidden and
// intermediate sizes off every tile multiple, 1 to 1024 tokens, top-k 1 to 8, LoRA rank 0 to 64,
// LoRA on only some experts, experts with no tokens, and decode-sized experts (1 to 3 rows)
// next to larger ones.
#include <vector>

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
  };
  return cases;
}

}  // namespace tilemoe::test
