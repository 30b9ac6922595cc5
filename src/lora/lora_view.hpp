#pragma once
// The internal side of zero-copy LoRA (the view types are public, include/tilemoe/lora.hpp):
// views of the LoRA sets loaders own, and the check every entry point runs on a caller's view.
#include <cmath>
#include <string>
#include <type_traits>

#include "src/lora/lora_weights.hpp"
#include "tilemoe/bf16.hpp"
#include "tilemoe/config.hpp"
#include "tilemoe/error.hpp"
#include "tilemoe/lora.hpp"

namespace tilemoe {

// Element i of a view's A or B (counted from `base`, a_of(e) or b_of(e)) as a float, whichever
// element type the view holds.
inline float factor_value(const void* base, LoraDType dtype, std::size_t i) {
  return dtype == LoraDType::bf16 ? bf16_to_float(static_cast<const bf16*>(base)[i]) : static_cast<const float*>(base)[i];
}

// Views of owned LoRA sets (loaders, tests): no copy, valid while `l` lives and is not resized.
template <typename T>
LayerLoraView lora_view(const LayerLoraT<T>& l) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, std::uint16_t>, "LoRA factors are f32 or bf16");
  LayerLoraView v;
  for (int i = 0; i < 3; ++i) {
    const auto& s = l.proj[i];
    auto& d = v.proj[i];
    d.rank = s.rank;
    d.in = s.in;
    d.out = s.out;
    d.dtype = std::is_same_v<T, float> ? LoraDType::f32 : LoraDType::bf16;
    if (s.rank == 0) continue;
    d.a = s.a.data();
    d.b = s.b.data();
    d.scale = s.scale.data();
    d.present = s.present.data();
  }
  return v;
}

template <typename T>
LayerLoraGrad lora_grad_view(LayerLoraT<T>& g) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, std::uint16_t>, "LoRA gradients are f32 or bf16");
  LayerLoraGrad v;
  for (int i = 0; i < 3; ++i) {
    v[i].dtype = std::is_same_v<T, float> ? LoraDType::f32 : LoraDType::bf16;
    if (g.proj[i].rank == 0) continue;
    v[i].a = g.proj[i].a.data();
    v[i].b = g.proj[i].b.data();
  }
  return v;
}

// Throws invalid_argument naming the projection when a view does not fit the layer: widths that
// differ from the shape, a rank above max_rank, missing arrays, a non-finite scale.
inline void validate_lora_view(const LayerLoraView& v, const MoeShape& s, int max_rank, const char* who) {
  for (Projection p : kProjections) {
    const auto& l = v[p];
    std::string where = std::string(who) + ": LoRA of " + projection_name(p) + ": ";
    if (l.rank < 0) fail(ErrorKind::invalid_argument, where + "negative rank " + std::to_string(l.rank));
    if (l.rank == 0) continue;
    if (l.rank > max_rank)
      fail(ErrorKind::invalid_argument, where + "rank " + std::to_string(l.rank) + " exceeds the layer's max_lora_rank " +
                                            std::to_string(max_rank));
    if (l.in != projection_in(s, p) || l.out != projection_out(s, p))
      fail(ErrorKind::invalid_argument, where + "A is [rank, " + std::to_string(l.in) + "] and B [" + std::to_string(l.out) +
                                            ", rank] but the layer needs in = " + std::to_string(projection_in(s, p)) +
                                            ", out = " + std::to_string(projection_out(s, p)));
    if (l.a == nullptr || l.b == nullptr) fail(ErrorKind::invalid_argument, where + "A or B is a null pointer");
    if (l.dtype != LoraDType::f32 && l.dtype != LoraDType::bf16)
      fail(ErrorKind::invalid_argument, where + "unknown element type " + std::to_string(static_cast<int>(l.dtype)) + " (f32 or bf16)");
    // Windows of larger arrays may be strided, but rows and experts must not overlap.
    const std::size_t a_row = l.lda();
    if (a_row < static_cast<std::size_t>(l.in) || l.strides.a_expert_of(l.rank, l.in) < static_cast<std::size_t>(l.rank) * a_row ||
        l.strides.b_expert_of(l.rank, l.out) < static_cast<std::size_t>(l.out) * l.rank)
      fail(ErrorKind::invalid_argument, where + "strides (A rows " + std::to_string(a_row) + ", A experts " +
                                            std::to_string(l.strides.a_expert_of(l.rank, l.in)) + ", B experts " +
                                            std::to_string(l.strides.b_expert_of(l.rank, l.out)) + ") make rows or experts overlap");
    for (int e = 0; e < s.num_experts; ++e)
      if (l.active(e) && !std::isfinite(l.scale_of(e)))
        fail(ErrorKind::invalid_argument, where + "expert " + std::to_string(e) + " has a non-finite scale");
  }
}

}  // namespace tilemoe
