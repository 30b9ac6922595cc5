#pragma once
// Per-expert LoRA of one MoE layer: every projection p of expert e computes
//   W x + scale[e] * B[e] (A[e] x),  A[e]: [rank, in], B[e]: [out, rank].
// Experts may have different ranks (PEFT's rank_pattern): A and B are zero-padded to the
// largest rank of the layer, which changes no result. Experts the adapter does not cover have
// present[e] = 0 and scale[e] = 0 and cost nothing.
#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#include "tilemoe/bf16.hpp"
#include "tilemoe/config.hpp"

namespace tilemoe {

template <typename T>
struct LoraProjectionT {
  int rank = 0;  // padded rank; 0 = no LoRA on this projection
  int in = 0;
  int out = 0;
  std::vector<T> a;                   // [E][rank][in]
  std::vector<T> b;                   // [E][out][rank]
  std::vector<float> scale;           // [E]
  std::vector<std::uint8_t> present;  // [E]
  std::vector<int> expert_rank;       // [E], the rank before padding (0 where absent)

  const T* a_of(int e) const { return a.data() + static_cast<std::size_t>(e) * rank * in; }
  const T* b_of(int e) const { return b.data() + static_cast<std::size_t>(e) * out * rank; }
  T* a_of(int e) { return a.data() + static_cast<std::size_t>(e) * rank * in; }
  T* b_of(int e) { return b.data() + static_cast<std::size_t>(e) * out * rank; }
  bool active(int e) const { return rank > 0 && present[e] != 0; }

  void allocate(int num_experts, int rank_, int in_, int out_) {
    rank = rank_;
    in = in_;
    out = out_;
    a.assign(static_cast<std::size_t>(num_experts) * rank * in, T(0));
    b.assign(static_cast<std::size_t>(num_experts) * out * rank, T(0));
    scale.assign(num_experts, 0.0f);
    present.assign(num_experts, 0);
    expert_rank.assign(num_experts, 0);
  }
};

template <typename T>
struct LayerLoraT {
  std::array<LoraProjectionT<T>, 3> proj;

  LoraProjectionT<T>& operator[](Projection p) { return proj[static_cast<int>(p)]; }
  const LoraProjectionT<T>& operator[](Projection p) const { return proj[static_cast<int>(p)]; }
  bool empty() const { return proj[0].rank == 0 && proj[1].rank == 0 && proj[2].rank == 0; }

  // Same shapes, zero values: the gradient buffers of this LoRA set.
  LayerLoraT zeros_like() const {
    LayerLoraT g = *this;
    for (auto& p : g.proj) {
      std::fill(p.a.begin(), p.a.end(), T(0));
      std::fill(p.b.begin(), p.b.end(), T(0));
    }
    return g;
  }

  // The same set with every factor element converted by `convert` (default: a numeric cast).
  template <typename U, typename Convert>
  LayerLoraT<U> cast(Convert convert) const {
    LayerLoraT<U> out;
    for (int i = 0; i < 3; ++i) {
      const auto& s = proj[i];
      auto& d = out.proj[i];
      d.rank = s.rank;
      d.in = s.in;
      d.out = s.out;
      d.a.resize(s.a.size());
      d.b.resize(s.b.size());
      std::transform(s.a.begin(), s.a.end(), d.a.begin(), convert);
      std::transform(s.b.begin(), s.b.end(), d.b.begin(), convert);
      d.scale = s.scale;
      d.present = s.present;
      d.expert_rank = s.expert_rank;
    }
    return out;
  }
  template <typename U>
  LayerLoraT<U> cast() const {
    return cast<U>([](T v) { return static_cast<U>(v); });
  }
};

using LayerLora = LayerLoraT<float>;
// A set whose factors are stored as bf16 bits (tilemoe::bf16): the form of a trainer's bf16
// parameters, read in place through lora_view as LoraDType::bf16.
using LayerLoraBf16 = LayerLoraT<std::uint16_t>;

// l's factors rounded to bf16 (as float_to_bf16), scales and presence as they are.
inline LayerLoraBf16 round_lora_to_bf16(const LayerLora& l) { return l.cast<std::uint16_t>(float_to_bf16); }

}  // namespace tilemoe
