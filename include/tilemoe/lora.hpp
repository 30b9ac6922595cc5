#pragma once
// Zero-copy LoRA: the caller's own arrays, read in place at every forward and backward. A trainer
// hands us pointers to its parameters once; an optimizer step that writes them is seen by the
// next call without telling us, and update_lora_weights swaps in another set by pointer.
//
// Per projection p of expert e: W v + scale[e] * B[e] (A[e] v) with A [E][rank][in], B [E][out][rank]
// (rows of experts the set does not cover may hold anything; present[e] = 0 marks them), f32 or
// bf16. Gradients come back in arrays of the same shapes, f32 or bf16.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "tilemoe/config.hpp"

namespace tilemoe {

// Strides, in elements, of a set that is a window of larger arrays (the NUMA split hands each node
// the B rows or A columns of its slice of the intermediate dimension); 0 means dense. Dense: A's
// rows are `in` apart, experts rank * in (A) and out * rank (B) apart; B's rows are always rank.
struct LoraStrides {
  std::size_t a_row = 0;
  std::size_t a_expert = 0;
  std::size_t b_expert = 0;

  std::size_t a_row_of(int in) const { return a_row != 0 ? a_row : static_cast<std::size_t>(in); }
  std::size_t a_expert_of(int rank, int in) const { return a_expert != 0 ? a_expert : static_cast<std::size_t>(rank) * a_row_of(in); }
  std::size_t b_expert_of(int rank, int out) const { return b_expert != 0 ? b_expert : static_cast<std::size_t>(out) * rank; }
};

// How a set's A and B (or their gradients) are stored: f32, or bf16 (a trainer's bf16 parameters),
// read and written in place either way; bf16 streams half the bytes at every call.
enum class LoraDType { f32, bf16 };
inline std::size_t lora_dtype_bytes(LoraDType d) { return d == LoraDType::bf16 ? 2 : 4; }

// How a layer holds an adapter it loads (MoeLayer::load_adapter): as its file stores the factors
// (bf16 when every factor tensor is BF16, else f32: the file's values exactly), or always f32, or
// always bf16 (f32 and f16 values rounded to nearest even, as kt-kernel keeps LoRA: half the
// memory, half the bytes read at decode).
enum class AdapterStorage { as_stored, f32, bf16 };

struct LoraProjectionView {
  int rank = 0;  // 0: no LoRA on this projection
  int in = 0, out = 0;
  const void* a = nullptr;                // [E][rank][in] of dtype (const float* or const bf16*)
  const void* b = nullptr;                // [E][out][rank] of dtype
  LoraDType dtype = LoraDType::f32;
  const float* scale = nullptr;           // [E]; nullptr: uniform_scale for every expert
  float uniform_scale = 1.0f;
  const std::uint8_t* present = nullptr;  // [E]; nullptr: every expert has LoRA
  LoraStrides strides;                    // of a and b, in elements; default: dense

  bool active(int e) const { return rank > 0 && (present == nullptr || present[e] != 0); }
  float scale_of(int e) const { return scale != nullptr ? scale[e] : uniform_scale; }
  std::size_t element_bytes() const { return lora_dtype_bytes(dtype); }
  std::size_t lda() const { return strides.a_row_of(in); }
  // The first element of expert e's A or B, and element `i` of A or B counted from their start.
  const void* a_of(int e) const { return a_at(static_cast<std::size_t>(e) * strides.a_expert_of(rank, in)); }
  const void* b_of(int e) const { return b_at(static_cast<std::size_t>(e) * strides.b_expert_of(rank, out)); }
  const void* a_at(std::size_t i) const { return static_cast<const char*>(a) + i * element_bytes(); }
  const void* b_at(std::size_t i) const { return static_cast<const char*>(b) + i * element_bytes(); }
  bool dense() const { return lda() == static_cast<std::size_t>(in) && strides.a_expert_of(rank, in) == static_cast<std::size_t>(rank) * in &&
                              strides.b_expert_of(rank, out) == static_cast<std::size_t>(out) * rank; }
};

struct LayerLoraView {
  std::array<LoraProjectionView, 3> proj;

  LoraProjectionView& operator[](Projection p) { return proj[static_cast<int>(p)]; }
  const LoraProjectionView& operator[](Projection p) const { return proj[static_cast<int>(p)]; }
  bool empty() const { return proj[0].rank == 0 && proj[1].rank == 0 && proj[2].rank == 0; }
  int max_rank() const { return std::max({proj[0].rank, proj[1].rank, proj[2].rank}); }
};

// Where backward writes the LoRA gradients: arrays shaped like the view's A and B, f32 or bf16 (a
// trainer's bf16 parameters; each element is computed in f32 and rounded once, also when added to).
// A null pointer means that gradient is not wanted.
struct LoraProjectionGrad {
  void* a = nullptr;  // [E][rank][in] of dtype (float* or bf16*)
  void* b = nullptr;  // [E][out][rank] of dtype
  LoraDType dtype = LoraDType::f32;
  LoraStrides strides;  // as in LoraProjectionView, in elements; default: dense

  std::size_t element_bytes() const { return lora_dtype_bytes(dtype); }
  std::size_t lda(int in) const { return strides.a_row_of(in); }
  // Expert e's first element of A or B; element i of A or B counted from their start.
  void* a_of(int e, int rank, int in) const { return a_at(static_cast<std::size_t>(e) * strides.a_expert_of(rank, in)); }
  void* b_of(int e, int rank, int out) const { return b_at(static_cast<std::size_t>(e) * strides.b_expert_of(rank, out)); }
  void* a_at(std::size_t i) const { return static_cast<char*>(a) + i * element_bytes(); }
  void* b_at(std::size_t i) const { return static_cast<char*>(b) + i * element_bytes(); }
};
using LayerLoraGrad = std::array<LoraProjectionGrad, 3>;

// Where a PEFT adapter keeps one projection's LoRA when it stacks it over the experts
// (target_parameters on transformers v5's experts.gate_up_proj / down_proj): one A [rank*E][in]
// under key_a, expert e's rows at e*rank; one B [b_rows][rank*E] under key_b, expert e's column j
// at j*E + e, this projection's rows first_row, first_row + row_step, ... Gate and up of
// gate_up_proj share both keys: one A for the two (its gradient is the sum of theirs) and one B,
// gate's rows first (row_step 1), or gate's and up's interleaved (gpt-oss: first rows 0 and 1,
// row_step 2). Empty (key_a "") for a projection the adapter keeps per expert, or has no LoRA for.
struct PeftStackedKeys {
  std::string key_a, key_b;
  int first_row = 0;
  int b_rows = 0;
  int row_step = 1;
  bool empty() const { return key_a.empty(); }
};
using LayerPeftStackedKeys = std::array<PeftStackedKeys, 3>;

}  // namespace tilemoe
