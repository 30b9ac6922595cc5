#include "src/reference/moe_reference.hpp"

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <vector>

#include "src/quant/quantize.hpp"
#include "src/routing/token_groups.hpp"

namespace tilemoe {
namespace {

template <typename S>
using Mat = Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <typename S>
using ConstMap = Eigen::Map<const Mat<S>>;
template <typename S>
using MutMap = Eigen::Map<Mat<S>>;

template <typename S>
Mat<S> to_matrix(const bf16* data, int rows, int cols) {
  Mat<S> m(rows, cols);
  for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = static_cast<S>(bf16_to_float(data[i]));
  return m;
}

template <typename S>
Mat<S> dequantized(const quant::QuantizedExperts& q, Projection p, int e) {
  const quant::QuantizedProjection& qp = q[p];
  std::vector<float> f(static_cast<std::size_t>(qp.n) * qp.k);
  quant::dequantize_expert(qp, e, f.data());
  return ConstMap<float>(f.data(), qp.n, qp.k).template cast<S>();
}

// Each row through per-row int8 quantization and back (what the integer kernels multiply).
template <typename S>
Mat<S> quantized_rows(const Mat<S>& v) {
  Mat<S> out(v.rows(), v.cols());
  std::vector<float> row(v.cols());
  std::vector<std::int8_t> codes(v.cols());
  for (Eigen::Index i = 0; i < v.rows(); ++i) {
    for (Eigen::Index j = 0; j < v.cols(); ++j) row[j] = static_cast<float>(v(i, j));
    const float scale = quant::quantize_activation_row(row.data(), static_cast<int>(v.cols()), codes.data());
    for (Eigen::Index j = 0; j < v.cols(); ++j) out(i, j) = static_cast<S>(codes[j]) * static_cast<S>(scale);
  }
  return out;
}

// One projection of one expert, kept together so forward and backward read the same thing.
template <typename S>
struct Proj {
  Mat<S> w;  // [out][in]
  const LoraProjectionT<S>* lora = nullptr;
  int expert;
  S scale = 0;
  Eigen::Matrix<S, 1, Eigen::Dynamic> bias;  // [out], or empty: none

  Proj(const ExpertWeightsView& ew, const LayerLoraT<S>& l, Projection p, int e, const quant::QuantizedExperts* quantized = nullptr)
      : w(quantized ? dequantized<S>(*quantized, p, e) : to_matrix<S>(ew.projection(p, e), projection_out(ew.shape, p), projection_in(ew.shape, p))),
        expert(e) {
    const int out = projection_out(ew.shape, p);
    if (quantized) {
      if (const float* b = quantized->biases.of(p, e)) bias = Eigen::Map<const Eigen::RowVectorXf>(b, out).template cast<S>();
    } else if (const bf16* b = p == Projection::gate ? ew.gate_bias : p == Projection::up ? ew.up_bias : ew.down_bias) {
      bias = to_matrix<S>(b + static_cast<std::size_t>(out) * e, 1, out);
    }
    if (l[p].active(e)) {
      lora = &l[p];
      scale = static_cast<S>(l[p].scale[e]);
    }
  }
  ConstMap<S> a() const { return ConstMap<S>(lora->a_of(expert), lora->rank, lora->in); }
  ConstMap<S> b() const { return ConstMap<S>(lora->b_of(expert), lora->out, lora->rank); }

  // v: [n][in] -> [n][out]
  Mat<S> apply(const Mat<S>& v, bool int8_activations = false) const {
    Mat<S> y = (int8_activations ? quantized_rows(v) : v) * w.transpose();
    if (lora) y.noalias() += scale * ((v * a().transpose()) * b().transpose());
    if (bias.size() > 0) y.rowwise() += bias;
    return y;
  }
  // dy: [n][out] -> dv [n][in]; adds this projection's LoRA gradients into grad.
  Mat<S> apply_backward(const Mat<S>& v, const Mat<S>& dy, LoraProjectionT<S>* grad) const {
    Mat<S> dv = dy * w;
    if (lora) {
      Mat<S> dy_b = dy * b();  // [n][r]
      dv.noalias() += scale * (dy_b * a());
      if (grad) {
        MutMap<S>(grad->b_of(expert), grad->out, grad->rank).noalias() += scale * (dy.transpose() * (v * a().transpose()));
        MutMap<S>(grad->a_of(expert), grad->rank, grad->in).noalias() += scale * (dy_b.transpose() * v);
      }
    }
    return dv;
  }
};

template <typename S>
S sigmoid(S g) {
  return S(1) / (S(1) + std::exp(-g));
}

// The SwiGLU of MoeShape: (clamp(u, -L, L) + o) * g' sigmoid(a g'), g' = min(g, L), with
// L = swiglu_limit > 0 (else no clamps), a = swiglu_alpha, o = swiglu_up_offset; and its gradients,
// where the clamp passes a gradient only where its input lies within the bounds (bounds included),
// as torch.clamp's.
template <typename S>
struct Swiglu {
  S limit, alpha, up_offset;
  explicit Swiglu(const MoeShape& s)
      : limit(static_cast<S>(s.swiglu_limit)), alpha(static_cast<S>(s.swiglu_alpha)), up_offset(static_cast<S>(s.swiglu_up_offset)) {}
  bool clamped() const { return limit > S(0); }
  S gate(S g) const { return clamped() && g > limit ? limit : g; }
  S up(S u) const { return (clamped() ? (u > limit ? limit : u < -limit ? -limit : u) : u) + up_offset; }
  S h(S g, S u) const {
    const S gc = gate(g);
    return gc * sigmoid(alpha * gc) * up(u);
  }
  // dL/dg and dL/du from dL/dh.
  S dgate(S dh, S g, S u) const {
    if (clamped() && !(g <= limit)) return S(0);
    const S gc = gate(g), sg = sigmoid(alpha * gc);
    return dh * up(u) * sg * (S(1) + alpha * gc * (S(1) - sg));  // d(g sigmoid(a g))/dg, exact
  }
  S dup(S dh, S g, S u) const {
    if (clamped() && !(u <= limit && u >= -limit)) return S(0);
    const S gc = gate(g);
    return dh * gc * sigmoid(alpha * gc);
  }
};

template <typename S>
Mat<S> gather_rows(const S* src, int cols, const TokenGroups& g, int e) {
  Mat<S> m(g.count(e), cols);
  for (int i = 0; i < g.count(e); ++i)
    std::copy_n(src + static_cast<std::size_t>(g.token[g.offsets[e] + i]) * cols, cols, m.row(i).data());
  return m;
}

}  // namespace

template <typename S>
void reference_forward(const ExpertWeightsView& w, const LayerLoraT<S>& lora, const MoeBatch<S>& batch, S* output,
                       const ReferenceOptions& options) {
  const bool q = options.int8_activations;
  const MoeShape& s = w.shape;
  const Swiglu<S> act(s);
  TokenGroups groups = group_tokens_by_expert(batch.expert_ids, batch.tokens, batch.top_k, s.num_experts);
  MutMap<S> out(output, batch.tokens, s.hidden);
  out.setZero();
  for (int e = 0; e < s.num_experts; ++e) {
    if (groups.count(e) == 0) continue;
    Mat<S> x = gather_rows(batch.input, s.hidden, groups, e);
    Mat<S> gate = Proj<S>(w, lora, Projection::gate, e, options.quantized).apply(x, q);
    Mat<S> up = Proj<S>(w, lora, Projection::up, e, options.quantized).apply(x, q);
    Mat<S> h = gate.binaryExpr(up, [act](S g, S u) { return act.h(g, u); });
    // The integer path keeps h in bf16 (as the kernels do) before quantizing it: the same codes.
    if (q) h = h.unaryExpr([](S v) { return static_cast<S>(bf16_to_float(float_to_bf16(static_cast<float>(v)))); });
    Mat<S> y = Proj<S>(w, lora, Projection::down, e, options.quantized).apply(h, q);
    for (int i = 0; i < groups.count(e); ++i) {
      int pos = groups.offsets[e] + i;
      out.row(groups.token[pos]) += batch.weights[groups.slot[pos]] * y.row(i);
    }
  }
}

template <typename S>
void reference_backward(const ExpertWeightsView& w, const LayerLoraT<S>& lora, const MoeBatch<S>& batch, const S* grad_output,
                        S* grad_input, LayerLoraT<S>* lora_grad, const ReferenceOptions& options) {
  const MoeShape& s = w.shape;
  const Swiglu<S> act(s);
  TokenGroups groups = group_tokens_by_expert(batch.expert_ids, batch.tokens, batch.top_k, s.num_experts);
  MutMap<S> dx_all(grad_input, batch.tokens, s.hidden);
  dx_all.setZero();
  if (lora_grad)
    for (auto& p : lora_grad->proj) {
      std::fill(p.a.begin(), p.a.end(), S(0));
      std::fill(p.b.begin(), p.b.end(), S(0));
    }
  auto grad_of = [&](Projection p) { return lora_grad && (*lora_grad)[p].rank > 0 ? &(*lora_grad)[p] : nullptr; };

  for (int e = 0; e < s.num_experts; ++e) {
    int n = groups.count(e);
    if (n == 0) continue;
    Proj<S> gate_p(w, lora, Projection::gate, e, options.quantized), up_p(w, lora, Projection::up, e, options.quantized),
        down_p(w, lora, Projection::down, e, options.quantized);
    Mat<S> x = gather_rows(batch.input, s.hidden, groups, e);
    // gate and up as the forward made them (with int8 activations, the integer kernels' x); the
    // gradients then pass through the weights as they are (straight through the quantization).
    Mat<S> gate = gate_p.apply(x, options.int8_activations), up = up_p.apply(x, options.int8_activations);
    Mat<S> h = gate.binaryExpr(up, [act](S g, S u) { return act.h(g, u); });
    Mat<S> dy(n, s.hidden);
    for (int i = 0; i < n; ++i) {
      int pos = groups.offsets[e] + i;
      dy.row(i) = batch.weights[groups.slot[pos]] * ConstMap<S>(grad_output + static_cast<std::size_t>(groups.token[pos]) * s.hidden, 1, s.hidden);
    }
    Mat<S> dh = down_p.apply_backward(h, dy, grad_of(Projection::down));
    Mat<S> dgate(n, s.intermediate), dup(n, s.intermediate);
    for (Eigen::Index i = 0; i < dh.size(); ++i) {
      dup.data()[i] = act.dup(dh.data()[i], gate.data()[i], up.data()[i]);
      dgate.data()[i] = act.dgate(dh.data()[i], gate.data()[i], up.data()[i]);
    }
    Mat<S> dx = gate_p.apply_backward(x, dgate, grad_of(Projection::gate));
    dx += up_p.apply_backward(x, dup, grad_of(Projection::up));
    for (int i = 0; i < n; ++i) dx_all.row(groups.token[groups.offsets[e] + i]) += dx.row(i);
  }
}

template void reference_forward<float>(const ExpertWeightsView&, const LayerLoraT<float>&, const MoeBatch<float>&, float*,
                                       const ReferenceOptions&);
template void reference_forward<double>(const ExpertWeightsView&, const LayerLoraT<double>&, const MoeBatch<double>&, double*,
                                        const ReferenceOptions&);
template void reference_backward<float>(const ExpertWeightsView&, const LayerLoraT<float>&, const MoeBatch<float>&, const float*,
                                        float*, LayerLoraT<float>*, const ReferenceOptions&);
template void reference_backward<double>(const ExpertWeightsView&, const LayerLoraT<double>&, const MoeBatch<double>&,
                                         const double*, double*, LayerLoraT<double>*, const ReferenceOptions&);

}  // namespace tilemoe
