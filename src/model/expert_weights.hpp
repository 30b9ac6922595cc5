#pragma once
// The routed experts of one MoE layer in bf16, as the checkpoint stores them.
#include <cstddef>
#include <vector>

#include "tilemoe/bf16.hpp"
#include "tilemoe/config.hpp"

namespace tilemoe {

// Non-owning view: the zero-copy form a server hands us, and what every path computes from.
// gate, up: [E][I][H]; down: [E][H][I]; each expert's matrix row-major and dense, the experts
// `*_stride` elements apart (0: one matrix after the other). A stacked gate_up [E][2I][H] (vLLM's
// and SGLang's w13, transformers v5's gate_up_proj) is gate = its data, up = data + I*H, both with
// stride 2*I*H.
//
// Optional biases (gpt-oss): gate_bias, up_bias [E][I] and down_bias [E][H], dense; null: none.
// gate's and up's are added before the activation, down's to the expert's output.
struct ExpertWeightsView {
  MoeShape shape;
  const bf16* gate = nullptr;
  const bf16* up = nullptr;
  const bf16* down = nullptr;
  std::size_t gate_stride = 0, up_stride = 0, down_stride = 0;
  const bf16* gate_bias = nullptr;
  const bf16* up_bias = nullptr;
  const bf16* down_bias = nullptr;

  bool has_biases() const { return gate_bias || up_bias || down_bias; }

  const bf16* projection(Projection p, int expert) const {
    const std::size_t per = static_cast<std::size_t>(shape.hidden) * shape.intermediate;
    const bf16* base = p == Projection::gate ? gate : p == Projection::up ? up : down;
    const std::size_t stride = p == Projection::gate ? gate_stride : p == Projection::up ? up_stride : down_stride;
    return base + (stride ? stride : per) * static_cast<std::size_t>(expert);
  }
};

struct ExpertWeights {
  MoeShape shape;
  std::vector<bf16> gate, up, down;
  std::vector<bf16> gate_bias, up_bias, down_bias;  // empty: none

  ExpertWeightsView view() const {
    ExpertWeightsView v{shape, gate.data(), up.data(), down.data()};
    v.gate_bias = gate_bias.empty() ? nullptr : gate_bias.data();
    v.up_bias = up_bias.empty() ? nullptr : up_bias.data();
    v.down_bias = down_bias.empty() ? nullptr : down_bias.data();
    return v;
  }
};

}  // namespace tilemoe
