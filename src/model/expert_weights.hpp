#pragma once
// The routed experts of one MoE layer in bf16, as the checkpoint stores them.
#include <cstddef>
#include <vector>

#include "tilemoe/bf16.hpp"
#include "tilemoe/config.hpp"

namespace tilemoe {

// Non-owning view: the zero-copy form a server hands us, and what every path computes from.
// gate, up: [E][I][H]; down: [E][H][I]; all row-major, contiguous.
struct ExpertWeightsView {
  MoeShape shape;
  const bf16* gate = nullptr;
  const bf16* up = nullptr;
  const bf16* down = nullptr;

  const bf16* projection(Projection p, int expert) const {
    std::size_t per = static_cast<std::size_t>(shape.hidden) * shape.intermediate;
    const bf16* base = p == Projection::gate ? gate : p == Projection::up ? up : down;
    return base + per * static_cast<std::size_t>(expert);
  }
};

struct ExpertWeights {
  MoeShape shape;
  std::vector<bf16> gate, up, down;

  ExpertWeightsView view() const { return {shape, gate.data(), up.data(), down.data()}; }
};

}  // namespace tilemoe
