#pragma once
// Shapes and names shared by every layer of the runtime.
#include <array>
#include <cstdint>
#include <limits>
#include <string>

namespace tilemoe {

// One MoE layer's routed experts. Each expert is down(silu(gate(x)) * up(x)) with
// gate, up: [intermediate, hidden] and down: [hidden, intermediate] (Hugging Face orientation).
struct MoeShape {
  int hidden = 0;
  int intermediate = 0;
  int num_experts = 0;
  int top_k = 0;
  // > 0: the clamped SwiGLU of DeepSeek-V4 (its config's swiglu_limit): each expert computes
  // silu(min(g, limit)) * clamp(u, -limit, limit) from g = gate(x), u = up(x), LoRA included.
  // 0: plain silu(g) * u.
  float swiglu_limit = 0.0f;
  // gpt-oss's form of the SwiGLU: (u' + swiglu_up_offset) * g' * sigmoid(swiglu_alpha * g'), with
  // g', u' gate and up after the clamps above (gpt-oss: limit 7, alpha 1.702, offset 1). 1 and 0:
  // the plain silu(g') * u'.
  float swiglu_alpha = 1.0f;
  float swiglu_up_offset = 0.0f;
};

// Whether `limit` is a swiglu_limit a layer accepts: 0 (none), or > 0 and a finite float.
inline bool valid_swiglu_limit(double limit) {
  return limit == 0.0 || (limit > 0.0 && limit <= static_cast<double>(std::numeric_limits<float>::max()));
}
// A swiglu_alpha: > 0 and a finite float. A swiglu_up_offset: a finite float.
inline bool valid_swiglu_alpha(double alpha) {
  return alpha > 0.0 && alpha <= static_cast<double>(std::numeric_limits<float>::max());
}
inline bool valid_swiglu_up_offset(double offset) {
  return offset >= -static_cast<double>(std::numeric_limits<float>::max()) &&
         offset <= static_cast<double>(std::numeric_limits<float>::max());
}

// How the base weights of the routed experts are stored and multiplied (LoRA is always f32/bf16):
// bf16; int8 with one scale per output channel (activations quantized per token at run time);
// int4 with one scale per group of the reduction dimension; mxfp4 (OCP microscaling FP4, gpt-oss's
// format): E2M1 values with one power-of-two scale per 32 inputs, multiplied with bf16
// activations (W4A16) as the exact bf16 weights they stand for.
enum class WeightType { bf16, int8, int4, mxfp4 };

// int8 and int4 multiply integer codes (activations quantized to int8 per token); bf16 and mxfp4
// multiply bf16 activations.
inline bool is_integer_weight_type(WeightType t) { return t == WeightType::int8 || t == WeightType::int4; }
// int4 and mxfp4 hold two codes a byte and one scale per group of inputs.
inline bool is_four_bit_weight_type(WeightType t) { return t == WeightType::int4 || t == WeightType::mxfp4; }

inline const char* weight_type_name(WeightType t) {
  switch (t) {
    case WeightType::bf16: return "bf16";
    case WeightType::int8: return "int8";
    case WeightType::int4: return "int4";
    case WeightType::mxfp4: return "mxfp4";
  }
  return "?";
}

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
