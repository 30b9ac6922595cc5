#pragma once
// Zero-copy LoRA: the caller's own arrays, read in place at every forward and backward. A trainer
// hands us pointers to its parameters once; an optimizer step that writes them is seen by the
// next call without telling us, and update_lora_weights swaps in another set by pointer.
//
// Per projection p of expert e: W v + scale[e] * B[e] (A[e] v) with A [E][rank][in], B [E][out][rank]
// (rows of experts the set does not cover may hold anything; present[e] = 0 marks them). Gradients
// come back in arrays of the same shapes.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include "src/lora/lora_weights.hpp"
#include "tilemoe/config.hpp"
#include "tilemoe/error.hpp"

namespace tilemoe {

struct LoraProjectionView {
  int rank = 0;  // 0: no LoRA on this projection
  int in = 0, out = 0;
  const float* a = nullptr;               // [E][rank][in]
  const float* b = nullptr;               // [E][out][rank]
  const float* scale = nullptr;           // [E]; nullptr: uniform_scale for every expert
  float uniform_scale = 1.0f;
  const std::uint8_t* present = nullptr;  // [E]; nullptr: every expert has LoRA

  bool active(int e) const { return rank > 0 && (present == nullptr || present[e] != 0); }
  float scale_of(int e) const { return scale != nullptr ? scale[e] : uniform_scale; }
  const float* a_of(int e) const { return a + static_cast<std::size_t>(e) * rank * in; }
  const float* b_of(int e) const { return b + static_cast<std::size_t>(e) * out * rank; }
};

struct LayerLoraView {
  std::array<LoraProjectionView, 3> proj;

  LoraProjectionView& operator[](Projection p) { return proj[static_cast<int>(p)]; }
  const LoraProjectionView& operator[](Projection p) const { return proj[static_cast<int>(p)]; }
  bool empty() const { return proj[0].rank == 0 && proj[1].rank == 0 && proj[2].rank == 0; }
  int max_rank() const { return std::max({proj[0].rank, proj[1].rank, proj[2].rank}); }
};

// Where backward writes the LoRA gradients: arrays shaped like the view's A and B. A null pointer
// means that gradient is not wanted.
struct LoraProjectionGrad {
  float* a = nullptr;  // [E][rank][in]
  float* b = nullptr;  // [E][out][rank]
};
using LayerLoraGrad = std::array<LoraProjectionGrad, 3>;

// Views of owned LoRA sets (loaders, tests): no copy, valid while `l` lives and is not resized.
inline LayerLoraView lora_view(const LayerLora& l) {
  LayerLoraView v;
  for (int i = 0; i < 3; ++i) {
    const auto& s = l.proj[i];
    auto& d = v.proj[i];
    d.rank = s.rank;
    d.in = s.in;
    d.out = s.out;
    if (s.rank == 0) continue;
    d.a = s.a.data();
    d.b = s.b.data();
    d.scale = s.scale.data();
    d.present = s.present.data();
  }
  return v;
}

inline LayerLoraGrad lora_grad_view(LayerLora& g) {
  LayerLoraGrad v;
  for (int i = 0; i < 3; ++i) {
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
    for (int e = 0; e < s.num_experts; ++e)
      if (l.active(e) && !std::isfinite(l.scale_of(e)))
        fail(ErrorKind::invalid_argument, where + "expert " + std::to_string(e) + " has a non-finite scale");
  }
}

}  // namespace tilemoe
