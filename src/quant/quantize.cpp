#include "src/quant/quantize.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <string>
#include <type_traits>

#include "amx/pack_int.hpp"
#include "amx/pack_mxfp4.hpp"
#include "numa/thread_pool.hpp"
#include "src/quant/quantize_into.hpp"
#include "tilemoe/error.hpp"

namespace tilemoe::quant {

namespace {

// Divisors of max|w| tried for an int4 group's scale. 7 maps the largest weight exactly onto the
// code 7; larger divisors clip it (to 7) but give the many small weights finer steps. On Gaussian
// weights the best of these cuts the norm-wise error from 0.117 to 0.101 at group 128 and from
// 0.097 to 0.087 at group 32.
constexpr float kInt4Divisors[] = {7.0f, 7.5f, 8.0f, 8.5f, 9.0f, 9.5f, 10.0f};

// Rounds to the nearest integer, ties to even (as nearbyint in the default rounding mode), then
// clamps. Clamping first keeps |v| far below 2^22, where adding and removing 1.5 * 2^23 rounds
// exactly; for integer bounds the result is the same as rounding first. std::nearbyint is a libm
// call on baseline x86-64 that saves and restores the floating-point environment: quantizing a
// DeepSeek-V2-Lite-sized checkpoint took 30 s at int8 and 71 s at int4 with it.
int round_clamp(float v, int lo, int hi) {
  if (!(v == v)) return 0;  // NaN: the callers reject non-finite weights before this
  constexpr float kMagic = 12582912.0f;
  const float c = std::clamp(v, static_cast<float>(lo), static_cast<float>(hi));
  return static_cast<int>((c + kMagic) - kMagic);
}

template <typename T>
float load_f32(const T* p, int i) {
  if constexpr (std::is_same_v<T, bf16>) return bf16_to_float(p[i]);
  else return p[i];
}

template <typename T>
float quantize_row_int8(const T* x, int k, std::int8_t* codes) {
  float amax = 0.0f;
  bool finite = true;
  for (int i = 0; i < k; ++i) {
    const float v = load_f32(x, i);
    finite = finite && std::isfinite(v);
    amax = std::max(amax, std::fabs(v));
  }
  if (!finite) {
    std::fill(codes, codes + k, std::int8_t{0});
    return std::nanf("");
  }
  if (amax == 0.0f) {
    std::fill(codes, codes + k, std::int8_t{0});
    return 0.0f;
  }
  // x * (127 / max) rather than x / scale: the kernels' quantize_rows computes the same product,
  // so the reference path sees the very codes the kernels multiply.
  const float scale = amax / kInt8MaxCode;
  const float inv = kInt8MaxCode / amax;
  for (int i = 0; i < k; ++i) codes[i] = static_cast<std::int8_t>(round_clamp(load_f32(x, i) * inv, -kInt8MaxCode, kInt8MaxCode));
  return scale;
}

}  // namespace

WeightType parse_weight_type(const std::string& name, const std::string& what) {
  if (name == "bf16") return WeightType::bf16;
  if (name == "int8") return WeightType::int8;
  if (name == "int4") return WeightType::int4;
  if (name == "mxfp4") return WeightType::mxfp4;
  fail(ErrorKind::invalid_argument, what + ": weight type '" + name + "' is not bf16, int8, int4 or mxfp4");
}

bool valid_int4_group(int group) { return group == 32 || group == 64 || group == 128; }

QuantizedProjection QuantizedProjection::allocate(WeightType type, int experts, int n, int k, int group) {
  QuantizedProjection q;
  q.type = type;
  q.experts = experts;
  q.n = n;
  q.k = k;
  q.group = type == WeightType::int8 ? std::max(k, 1) : type == WeightType::mxfp4 ? kMxfp4Group : group;
  q.codes.assign(q.expert_code_bytes() * experts, 0);
  q.scales.assign(q.expert_scale_count() * experts, 0.0f);
  return q;
}

void quantize_int8_matrix(const bf16* w, int n, int k, std::size_t ldw, std::int8_t* codes, float* scales) {
  for (int r = 0; r < n; ++r) scales[r] = quantize_row_int8(w + ldw * r, k, codes + static_cast<std::size_t>(k) * r);
}

namespace {

// The squared error of rounding v[0, len) at each of N scales, each summed in element order in
// double, as one scale at a time would sum it: the N sums are independent chains, so a pass
// over the group serves every candidate (one chain of dependent double adds a candidate had kept
// int4 quantization at a quarter of int8's rate).
template <int N>
void rounding_errors(const float* v, int len, const float (&scale)[N], int count, double (&err)[N]) {
  float inv[N];
  for (int j = 0; j < N; ++j) {
    inv[j] = j < count ? 1.0f / scale[j] : 0.0f;
    err[j] = 0.0;
  }
  for (int i = 0; i < len; ++i) {
    const float x = v[i];
    for (int j = 0; j < N; ++j) {
      const float e = static_cast<float>(round_clamp(x * inv[j], -8, 7)) * scale[j] - x;
      err[j] += static_cast<double>(e) * e;
    }
  }
}

// The first of scale[0, count) with the least error (ties to the earlier).
template <int N>
float least_error_scale(const float* v, int len, const float (&scale)[N], int count) {
  double err[N];
  rounding_errors(v, len, scale, count, err);
  int best = 0;
  for (int j = 1; j < count; ++j)
    if (err[j] < err[best]) best = j;
  return scale[best];
}

}  // namespace

void quantize_int4_matrix(const bf16* w, int n, int k, std::size_t ldw, int group, std::int8_t* codes, float* scales) {
  const std::size_t row_bytes = static_cast<std::size_t>(k + 1) / 2;
  const int groups = (k + group - 1) / group;
  constexpr int kDivisors = static_cast<int>(std::size(kInt4Divisors));
  std::vector<float> v(static_cast<std::size_t>(k)), ideal(static_cast<std::size_t>(groups));
  for (int r = 0; r < n; ++r) {
    float row_max = 0.0f;
    for (int i = 0; i < k; ++i) v[static_cast<std::size_t>(i)] = bf16_to_float(w[ldw * r + i]);
    // Each group's best scale on its own: the divisor of max|w| with the least squared error.
    for (int g = 0; g < groups; ++g) {
      const int k0 = g * group, len = std::min(group, k - k0);
      const float* vg = v.data() + k0;
      float m = 0.0f;
      for (int i = 0; i < len; ++i) m = std::max(m, std::fabs(vg[i]));
      row_max = std::max(row_max, m);
      float candidates[kDivisors];
      for (int d = 0; d < kDivisors; ++d) candidates[d] = m / kInt4Divisors[d];
      ideal[static_cast<std::size_t>(g)] = m == 0.0f ? 0.0f : least_error_scale(vg, len, candidates, kDivisors);
    }
    // Then the nearest of the scales unit * m (m = 1..16) with unit = max|w| of the row / (7 * 16),
    // which reaches every group's divisors 7 to 10: group scales that are integer multiples of one
    // column scale let the AMX kernel sum a whole row of K in int32 (pack_int.hpp,
    // decompose_int4_scales). On Gaussian weights the norm-wise error moves from 0.101 to 0.102 at
    // group 128 and from 0.087 to 0.089 at group 32. A row too small for a normal unit keeps its
    // free scales.
    const float unit = row_max / (7.0f * kernels::kInt4MaxGroupMultiple);
    float* row_scales = scales + static_cast<std::size_t>(groups) * r;
    for (int g = 0; g < groups; ++g) {
      float chosen = ideal[static_cast<std::size_t>(g)];
      if (chosen > 0.0f && std::isnormal(unit)) {
        const int k0 = g * group, len = std::min(group, k - k0);
        const int centre = std::clamp(static_cast<int>(chosen / unit + 0.5f), 1, kernels::kInt4MaxGroupMultiple);
        float near[3] = {0.0f, 0.0f, 0.0f};
        int count = 0;
        for (int m = std::max(1, centre - 1); m <= std::min(kernels::kInt4MaxGroupMultiple, centre + 1); ++m)
          near[count++] = unit * static_cast<float>(m);
        chosen = least_error_scale(v.data() + k0, len, near, count);
      }
      row_scales[g] = chosen;
    }
    auto* row = reinterpret_cast<std::uint8_t*>(codes + row_bytes * r);
    std::fill(row, row + row_bytes, std::uint8_t{0});
    for (int g = 0; g < groups; ++g) {
      if (row_scales[g] == 0.0f) continue;
      const int k0 = g * group, len = std::min(group, k - k0);
      const float inv = 1.0f / row_scales[g];
      for (int kk = k0; kk < k0 + len; ++kk) {
        const auto nibble = static_cast<std::uint8_t>(round_clamp(v[static_cast<std::size_t>(kk)] * inv, -8, 7) & 0x0f);
        row[kk / 2] |= (kk & 1) ? static_cast<std::uint8_t>(nibble << 4) : nibble;
      }
    }
  }
}

namespace {

constexpr int kMxfp4MinScaleLog2 = kernels::kMxfp4MinExponent - kMxfp4ExponentBias;  // -125
constexpr int kMxfp4MaxScaleLog2 = kernels::kMxfp4MaxExponent - kMxfp4ExponentBias;  // 125

// The nearest E2M1 magnitude code of |x|, ties to the even code (as round-to-nearest-even does
// with E2M1's one mantissa bit); beyond 6 it saturates, and NaN gives 7. The count of midpoints
// passed, not a chain of branches: random weights made those branches a coin toss each, and the
// count vectorizes (the bench's MXFP4 quantization of DeepSeek-V2-Lite's experts here: 10.4 -> 3.6 s).
// The same code as that chain for every float, NaN included (checked over all 2^32 bit patterns).
int e2m1_magnitude_code(float a) {
  return static_cast<int>(!(a <= 0.25f)) + static_cast<int>(!(a < 0.75f)) + static_cast<int>(!(a <= 1.25f)) +
         static_cast<int>(!(a < 1.75f)) + static_cast<int>(!(a <= 2.5f)) + static_cast<int>(!(a < 3.5f)) + static_cast<int>(!(a <= 5.0f));
}

// The sign kept for zeros too (-0 is E2M1's code 8), as IEEE rounding keeps it: weights that came
// from MXFP4 come back bit for bit.
int e2m1_code(float x) {
  const int m = e2m1_magnitude_code(std::fabs(x));
  return std::signbit(x) ? m | 8 : m;
}

}  // namespace

// From the bits, not frexp: a layer's check reads every group's scale (100 M at gpt-oss-120b's).
bool valid_mxfp4_scale(float scale) {
  std::uint32_t bits;
  std::memcpy(&bits, &scale, sizeof bits);
  const int field = static_cast<int>(bits >> 23);  // the sign bit makes it >= 256
  return (bits & 0x007fffffu) == 0 && field >= kMxfp4MinScaleLog2 + kMxfp4ExponentBias && field <= kMxfp4MaxScaleLog2 + kMxfp4ExponentBias;
}

int mxfp4_scale_exponent(float scale) {
  std::uint32_t bits;
  std::memcpy(&bits, &scale, sizeof bits);
  return static_cast<int>((bits >> 23) & 0xffu);
}

float quantized_code_value(WeightType type, const std::int8_t* row, int kk) {
  switch (type) {
    case WeightType::int4: return static_cast<float>(int4_code(row, kk));
    case WeightType::mxfp4: {
      const auto byte = static_cast<std::uint8_t>(row[kk / 2]);
      return kE2m1Values[(kk & 1) ? byte >> 4 : byte & 0x0f];
    }
    default: return static_cast<float>(row[kk]);
  }
}

void quantize_mxfp4_matrix(const bf16* w, int n, int k, std::size_t ldw, std::int8_t* codes, float* scales) {
  const std::size_t row_bytes = static_cast<std::size_t>(k + 1) / 2;
  const int groups = (k + kMxfp4Group - 1) / kMxfp4Group;
  float v[kMxfp4Group];
  for (int r = 0; r < n; ++r) {
    const bf16* row = w + ldw * r;
    auto* out = reinterpret_cast<std::uint8_t*>(codes + row_bytes * r);
    std::fill(out, out + row_bytes, std::uint8_t{0});
    for (int g = 0; g < groups; ++g) {
      const int k0 = g * kMxfp4Group, len = std::min(k, k0 + kMxfp4Group) - k0;
      float amax = 0.0f;
      for (int i = 0; i < len; ++i) {
        v[i] = bf16_to_float(row[k0 + i]);
        amax = std::max(amax, std::fabs(v[i]));
      }
      // Scales are powers of two in [2^-125, 2^125], so v * (1 / scale) and code * scale are exact
      // (or rounded once, as ldexp would round, where a product falls below the normal range).
      int chosen = 0;
      if (amax > 0.0f) {
        int exponent = 0;
        std::frexp(amax, &exponent);  // floor(log2 amax) = exponent - 1; E2M1's largest exponent is 2
        const int first = std::clamp(exponent - 3, kMxfp4MinScaleLog2, kMxfp4MaxScaleLog2);
        double best = -1.0;
        for (int log2 = first; log2 <= std::min(first + 1, kMxfp4MaxScaleLog2); ++log2) {
          const float scale = std::ldexp(1.0f, log2), inv = std::ldexp(1.0f, -log2);
          double err = 0.0;
          for (int i = 0; i < len; ++i) {
            const double d = static_cast<double>(kE2m1Values[e2m1_code(v[i] * inv)] * scale) - v[i];
            err += d * d;
          }
          if (best < 0.0 || err < best) {
            best = err;
            chosen = log2;
          }
        }
      }
      scales[static_cast<std::size_t>(groups) * r + g] = std::ldexp(1.0f, chosen);
      const float inv = std::ldexp(1.0f, -chosen);
      for (int i = 0; i < len; ++i) {
        const int kk = k0 + i;
        const auto code = static_cast<std::uint8_t>(e2m1_code(v[i] * inv));
        out[kk / 2] |= (kk & 1) ? static_cast<std::uint8_t>(code << 4) : code;
      }
    }
  }
}

void dequantize_expert(const QuantizedProjection& q, int e, float* out) {
  const std::int8_t* codes = q.codes_of(e);
  const float* scales = q.scales_of(e);
  const int groups = q.groups_per_row();
  for (int r = 0; r < q.n; ++r) {
    const std::int8_t* row = codes + q.row_bytes() * r;
    for (int kk = 0; kk < q.k; ++kk) {
      out[static_cast<std::size_t>(q.k) * r + kk] = quantized_code_value(q.type, row, kk) * scales[static_cast<std::size_t>(groups) * r + kk / q.group];
    }
  }
}

QuantizedExperts quantize_experts(const ExpertWeightsView& w, WeightType type, int group, numa::ThreadPool* pool) {
  QuantizedExperts q;  // empty: quantize_experts_into allocates
  quantize_experts_into(w, type, group, pool, q);
  return q;
}

ExpertWeights dequantize_experts(const QuantizedExperts& q) {
  ExpertWeights w;
  w.shape = q.shape;
  const std::size_t per = static_cast<std::size_t>(q.shape.hidden) * q.shape.intermediate;
  std::vector<float> tmp(per);
  for (Projection p : kProjections) {
    auto& dst = p == Projection::gate ? w.gate : p == Projection::up ? w.up : w.down;
    dst.resize(per * q.shape.num_experts);
    for (int e = 0; e < q.shape.num_experts; ++e) {
      dequantize_expert(q[p], e, tmp.data());
      for (std::size_t i = 0; i < per; ++i) dst[per * e + i] = float_to_bf16(tmp[i]);
    }
  }
  // The biases came from bf16 (ExpertWeightsView): back to bf16 exactly.
  auto to_bf16 = [](const std::vector<float>& src, std::vector<bf16>& dst) {
    for (float v : src) dst.push_back(float_to_bf16(v));
  };
  to_bf16(q.biases.gate, w.gate_bias);
  to_bf16(q.biases.up, w.up_bias);
  to_bf16(q.biases.down, w.down_bias);
  return w;
}

float quantize_activation_row(const float* x, int k, std::int8_t* codes) { return quantize_row_int8(x, k, codes); }
float quantize_activation_row(const bf16* x, int k, std::int8_t* codes) { return quantize_row_int8(x, k, codes); }

}  // namespace tilemoe::quant
