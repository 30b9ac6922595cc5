#pragma once
// Quantized expert weights in their canonical, row-major form: what `tilemoe quantize` writes and
// reads, what the kernels' packers take, and what the reference path dequantizes. Both integer
// types are symmetric (zero maps to zero, no offsets):
//  - int8: one f32 scale per output row (channel); codes in [-127, 127].
//  - int4: one f32 scale per group of `group` consecutive inputs of a row (32, 64 or 128; the last
//    group of a row may be shorter); codes in [-8, 7], two per byte, the even input in the low
//    nibble, two's complement. The scale of each group is chosen among a few candidates to
//    minimise that group's squared error (clipping the largest weights when that pays).
//  - mxfp4: E2M1 codes (sign bit 3; values 0, 0.5, 1, 1.5, 2, 3, 4, 6), two per byte as int4's,
//    with one f32 scale per 32 inputs that is a power of two in [2^-125, 2^125] (an E8M0 exponent
//    of the range pack_mxfp4.hpp multiplies exactly). The scale is OCP's, 2^(floor(log2 max|w|) - 2),
//    or twice it where that gives the group a smaller squared error: weights that came from MXFP4
//    (a gpt-oss checkpoint, dequantized) come back as the same values.
// Activations are quantized at run time, one int8 scale per token row (quantize_activation_row).
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "tilemoe/bf16.hpp"
#include "tilemoe/config.hpp"
#include "tilemoe/mxfp4.hpp"
#include "src/model/expert_biases.hpp"
#include "src/model/expert_weights.hpp"

namespace tilemoe::numa {
class ThreadPool;
}

namespace tilemoe::quant {

inline constexpr int kDefaultInt4Group = 128;
inline constexpr int kInt8MaxCode = 127;

// The group sizes int4 accepts: 32, 64, 128.
bool valid_int4_group(int group);

// "bf16", "int8", "int4" or "mxfp4"; anything else is Error(invalid_argument) naming `what` (e.g. the option).
WeightType parse_weight_type(const std::string& name, const std::string& what);

// One projection of every expert: n output rows of k inputs each (Hugging Face orientation).
struct QuantizedProjection {
  WeightType type = WeightType::int8;
  int experts = 0, n = 0, k = 0;
  int group = 0;                   // inputs per scale: k for int8, the group size for int4, 32 for mxfp4
  std::vector<std::int8_t> codes;  // [E][n][row_bytes()]
  std::vector<float> scales;       // [E][n][groups_per_row()]

  int groups_per_row() const { return k == 0 ? 0 : (k + group - 1) / group; }
  std::size_t row_bytes() const { return is_four_bit_weight_type(type) ? static_cast<std::size_t>(k + 1) / 2 : k; }
  std::size_t expert_code_bytes() const { return row_bytes() * static_cast<std::size_t>(n); }
  std::size_t expert_scale_count() const { return static_cast<std::size_t>(groups_per_row()) * n; }
  const std::int8_t* codes_of(int e) const { return codes.data() + expert_code_bytes() * e; }
  const float* scales_of(int e) const { return scales.data() + expert_scale_count() * e; }
  std::int8_t* codes_of(int e) { return codes.data() + expert_code_bytes() * e; }
  float* scales_of(int e) { return scales.data() + expert_scale_count() * e; }
  // Allocates codes and scales for the given shape (contents zero).
  static QuantizedProjection allocate(WeightType type, int experts, int n, int k, int group);
};

// A layer's routed experts, quantized: gate, up [E][I][H]; down [E][H][I].
struct QuantizedExperts {
  MoeShape shape;
  WeightType type = WeightType::int8;
  int group = 0;  // int4 group size; 32 for mxfp4; 0 for int8
  std::array<QuantizedProjection, 3> proj;
  ExpertBiases biases;  // kept in f32 as they came (never quantized)

  const QuantizedProjection& operator[](Projection p) const { return proj[static_cast<int>(p)]; }
  QuantizedProjection& operator[](Projection p) { return proj[static_cast<int>(p)]; }
};

// W [n][k] (row stride ldw) -> codes [n][k], scales [n].
void quantize_int8_matrix(const bf16* w, int n, int k, std::size_t ldw, std::int8_t* codes, float* scales);
// W [n][k] -> codes [n][(k+1)/2] bytes, scales [n][ceil(k/group)].
void quantize_int4_matrix(const bf16* w, int n, int k, std::size_t ldw, int group, std::int8_t* codes, float* scales);
// The int4 code of input kk in a row of packed nibbles, sign-extended.
inline int int4_code(const std::int8_t* row, int kk) {
  const auto byte = static_cast<std::uint8_t>(row[kk / 2]);
  const int nibble = (kk & 1) ? (byte >> 4) : (byte & 0x0f);
  return nibble >= 8 ? nibble - 16 : nibble;
}
// W [n][k] -> E2M1 codes [n][(k+1)/2] bytes, power-of-two scales [n][ceil(k/32)].
void quantize_mxfp4_matrix(const bf16* w, int n, int k, std::size_t ldw, std::int8_t* codes, float* scales);
// Whether an mxfp4 scale is one the kernels multiply exactly (a power of two in [2^-125, 2^125]).
bool valid_mxfp4_scale(float scale);
// The E8M0 exponent of a valid mxfp4 scale (2^(e - 127)); unspecified for others.
int mxfp4_scale_exponent(float scale);
// Input kk of a quantized row before its scale: the int8 or int4 code, or the E2M1 value.
float quantized_code_value(WeightType type, const std::int8_t* row, int kk);
// code * scale of every element of expert e's matrix, as f32 [n][k].
void dequantize_expert(const QuantizedProjection& q, int e, float* out);

// Quantizes every expert, in parallel on `pool` when given. Throws Error(invalid_argument) for an
// int4 group that valid_int4_group refuses or a type other than int8/int4/mxfp4 (whose group is 32
// whatever `group` says).
QuantizedExperts quantize_experts(const ExpertWeightsView& w, WeightType type, int group, numa::ThreadPool* pool);
// Dequantized to bf16 (rounded to nearest even), for the reference path and the error report.
ExpertWeights dequantize_experts(const QuantizedExperts& q);

// Per-token int8 activation quantization (W8A8 and W4A8): scale = max|x| / 127, codes
// round-to-nearest-even(x / scale). A row of zeros gets scale 0; a row holding NaN or Inf gets a
// NaN scale, so the products of that token are NaN, as they would be in PyTorch.
float quantize_activation_row(const float* x, int k, std::int8_t* codes);
float quantize_activation_row(const bf16* x, int k, std::int8_t* codes);

}  // namespace tilemoe::quant
