#pragma once
// Shapes and names shared by every layer of the runtime.
#include <array>
#include <cstdint>
#include <string>

namespace tilemoe {

// One MoE layer's routed experts. Each expert is down(silu(gate(x)) * up(x)) with
// gate, up: [intermediate, hidden] and down: [hidden, intermediate] (Hugging Face orientation).
struct MoeShape {
  int hidden = 0;
  int intermediate = 0;
  int num_experts = 0;
  int top_k = 0;
};

enum class Projection : int { gate = 0, up = 1, down = 2 };
inline constexpr std::array<Projection, 3> kProjections = {Projection::gate, Projection::up, Projection::down};

inline const char* projection_name(Projection p) {
  switch (p) {
    case Projection::gate: return "gate";
    case Projection::up: return "up";
    case Projection::down: return "down";
  }
  return "?";
}

// Input and output widths of a projection: gate/up map hidden -> intermediate, down the reverse.
inline int projection_in(const MoeShape& s, Projection p) { return p == Projection::down ? s.intermediate : s.hidden; }
inline int projection_out(const MoeShape& s, Projection p) { return p == Projection::down ? s.hidden : s.intermediate; }

// LoRA scaling as PEFT computes it: alpha / r, or alpha / sqrt(r) with rsLoRA.
double lora_scaling(double alpha, int rank, bool use_rslora);

}  // namespace tilemoe
