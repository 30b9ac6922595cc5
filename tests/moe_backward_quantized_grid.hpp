#pragma once
// Fine-tuning through a frozen int8/int4/mxfp4 base (QLoRA-style): forward_sft on the quantized
// weights (int8 activations for int8/int4, as in inference), backward through the same weights
// dequantized k-block by k-block, against the reference backward on the dequantized weights. The forward's activation
// quantization is the only difference between the two (the backward treats it as the identity,
// the straight-through estimator), so the bars sit a little above the bf16 path's.
#include <bit>
#include <cstdio>
#include <cstdlib>

#include "catch.hpp"
#include "moe_backward_grid.hpp"
#include "moe_forward_quantized_grid.hpp"
#include "src/layer/tensor_parallel_layer.hpp"

namespace tilemoe::test {

struct QuantSftErrors {
  double out = 0, grad_input = 0, lora = 0;
};

inline QuantSftErrors quantized_sft_errors(kernels::Isa isa, const QuantCase& qc, const MoeShape& s, int tokens, int rank, int lora_every,
                                           numa::ThreadPool& pool, std::uint64_t seed) {
  auto w = random_expert_weights(s, seed);
  auto q = quant::quantize_experts(w.view(), qc.type, qc.group, &pool);
  ExpertWeights dq = quant::dequantize_experts(q);
  LayerLora lora = random_lora(s, rank, 2.0f * std::max(rank, 1), seed + 1, lora_every);
  auto routing = random_routing(tokens, s, seed + 2);
  for (std::size_t i = 5; i < routing.expert_ids.size(); i += 7) routing.expert_ids[i] = -1;
  auto x = random_activations(static_cast<std::size_t>(tokens) * s.hidden, seed + 3);
  auto xb = to_bf16(x.data(), x.size());
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = bf16_to_float(xb[i]);
  auto go = random_activations(x.size(), seed + 4);
  MoeBatch<float> batch{tokens, s.top_k, x.data(), routing.expert_ids.data(), routing.weights.data()};
  std::vector<float> want_out(x.size()), want_dx(x.size());
  LayerLora want_grads = lora.zeros_like();
  reference_forward(dq.view(), lora, batch, want_out.data());
  // The forward's gate and up are W8A8's products of the codes (the clamp's gradient masks are
  // decided on them).
  ReferenceOptions backward_options;
  backward_options.int8_activations = is_integer_weight_type(qc.type);
  backward_options.quantized = &q;
  reference_backward(dq.view(), lora, batch, go.data(), want_dx.data(), &want_grads, backward_options);

  auto packed = PackedExpertWeights::pack_quantized(q, pool);
  MoeSftLayer layer(packed, isa, pool, {std::max(tokens, 1), 1, std::max(rank, 1), s.top_k}, lora_view(lora));
  std::vector<float> out(x.size());
  std::vector<float> dx;
  dx.assign(x.size(), 7.0f);
  LayerLora grads = lora.zeros_like();
  for (auto& p : grads.proj) {
    std::fill(p.a.begin(), p.a.end(), 7.0f);
    std::fill(p.b.begin(), p.b.end(), 7.0f);
  }
  layer.forward_sft(tokens, s.top_k, xb.data(), routing.expert_ids.data(), routing.weights.data(), out.data(), true);
  layer.backward(go.data(), dx.data(), lora_grad_view(grads));
  if (rank > 0) {
    // The set stored as bf16, swapped in by pointer: the same bits.
    const LayerLoraBf16 lora16 = bf16_copy_of_exact(lora);
    layer.update_lora_weights(lora_view(lora16));
    // Its gradients in bf16 too: the f32 ones rounded once.
    std::vector<float> out16(x.size()), dx16(x.size(), 7.0f);
    LayerLoraBf16 grads16 = round_lora_to_bf16(grads);  // junk to overwrite
    layer.forward_sft(tokens, s.top_k, xb.data(), routing.expert_ids.data(), routing.weights.data(), out16.data(), true);
    layer.backward(go.data(), dx16.data(), lora_grad_view(grads16));
    INFO("the set and its gradients stored as bf16");
    CHECK(out16 == out);
    CHECK(dx16 == dx);
    check_bf16_grads(grads, grads16);
  }
  QuantSftErrors e;
  e.out = rel_error(out, want_out);
  e.grad_input = rel_error(dx, want_dx);
  for (int p = 0; p < 3; ++p)
    e.lora = std::max({e.lora, rel_error(grads.proj[p].a, want_grads.proj[p].a), rel_error(grads.proj[p].b, want_grads.proj[p].b)});
  return e;
}

inline void run_quantized_backward_grid(kernels::Isa isa) {
  numa::ThreadPool& pool = pool_for_threads(0);
  for (const QuantCase& qc : kQuantCases)
    for (const auto& c : awkward_shape_grid()) {
      if (c.tokens > 256) continue;
      INFO(weight_type_name(qc.type) << " group " << qc.group << " hidden " << c.shape.hidden << " inter " << c.shape.intermediate
                                     << " experts " << c.shape.num_experts << " top-" << c.shape.top_k << " swiglu_limit " << backward_shape(c.shape).swiglu_limit << " tokens " << c.tokens
                                     << " rank " << c.rank << " lora on every " << c.lora_every);
      const QuantSftErrors e = quantized_sft_errors(isa, qc, backward_shape(c.shape), c.tokens, c.rank, c.lora_every, pool, 57 + c.tokens);
      if (std::getenv("TILEMOE_PRINT_ERRORS"))
        std::printf("%s g%d T=%d r=%d: out %.4f dx %.4f lora %.4f\n", weight_type_name(qc.type), qc.group, c.tokens, c.rank, e.out,
                    e.grad_input, e.lora);
      CHECK(e.out <= 2.5e-2);
      CHECK(e.grad_input <= 2e-2);
      CHECK(e.lora <= 4e-2);
    }
}

// The transposed repack of int weights equals the bf16 one applied to the dequantized weights
// packed as bf16, for every panel range the backward uses.
inline void check_transposed_int_matches_bf16(kernels::PackTransposedIntFn transpose = kernels::pack_transposed_kblock_int_portable) {
  for (const QuantCase& qc : kQuantCases)
    if (is_integer_weight_type(qc.type))
    for (auto [n, k] : {std::pair{17, 40}, {48, 64}, {100, 257}, {33, 128}, {16, 1}, {200, 384}}) {
      INFO(weight_type_name(qc.type) << " group " << qc.group << " n " << n << " k " << k);
      MoeShape s{k, n, 1, 1};  // gate: [intermediate n][hidden k]
      auto w = random_expert_weights(s, 5);
      auto q = quant::quantize_experts(w.view(), qc.type, qc.group, nullptr);
      auto packed = PackedExpertWeights::pack_quantized(q, pool_for_threads(1));
      ExpertWeights dq = quant::dequantize_experts(q);
      auto ref = PackedExpertWeights::pack(dq.view(), pool_for_threads(1));
      const kernels::PackedShape ps = ref.up_shape();
      for (auto [nb0, nb1] : {std::pair{0, ps.panels}, {ps.panels / 2, ps.panels}}) {
        if (nb1 <= nb0) continue;
        const std::size_t stride = static_cast<std::size_t>(kernels::transposed_kblocks(nb1 - nb0)) * kernels::kBlockElements;
        std::vector<bf16> got(2 * stride, bf16{0x7777}), want(2 * stride, bf16{0x7777});
        for (int kb = 0; kb < ps.kblocks; ++kb) {
          transpose(packed.int_shape(Projection::gate), packed.packed_int(Projection::gate, 0), nb0, nb1, kb, got.data(), stride);
          kernels::pack_transposed_kblock_portable(ref.packed(Projection::gate, 0) + static_cast<std::size_t>(nb0) * ps.kblocks *
                                                                                         kernels::kBlockElements,
                                                   nb1 - nb0, ps.kblocks, kb, want.data(), stride);
          INFO("panels [" << nb0 << ", " << nb1 << ") kb " << kb);
          REQUIRE(got == want);
        }
      }
    }
}

// Non-finite and huge scales (which no quantizer writes, but a kernel must not turn into other
// bits): a vector repack gives the portable repack's bits, NaN (a NaN scale, an Inf scale times a
// zero code), Inf and overflow included, for int8 and int4 codes of every value.
inline void check_transposed_int_nonfinite_scales(kernels::PackTransposedIntFn transpose) {
  std::mt19937 rng(91);
  for (int bits : {8, 4}) {
    INFO("bits " << bits);
    const kernels::PackedIntShape s = kernels::packed_int_shape(bits, 48, 256, bits == 8 ? 0 : 64);
    std::vector<std::uint8_t> codes(s.code_bytes());
    for (auto& c : codes) c = static_cast<std::uint8_t>(rng());
    std::vector<float> scales(s.scale_count());
    std::normal_distribution<float> dist(0.0f, 0.02f);
    for (auto& v : scales) v = dist(rng);
    // NaNs with full payloads: rounding their bits as a number's would carry into the exponent.
    const float specials[] = {std::nanf(""), std::bit_cast<float>(0x7fffffffu), std::bit_cast<float>(0xffbfffffu), INFINITY, -INFINITY,
                              3.0e38f, -2.9e38f, 1e-45f, 0.0f};
    for (std::size_t i = 0; i < scales.size(); i += 5) scales[i] = specials[(i / 5) % 9];
    const kernels::PackedIntView v{codes.data(), scales.data()};
    const std::size_t stride = static_cast<std::size_t>(kernels::transposed_kblocks(s.panels)) * kernels::kBlockElements;
    std::vector<bf16> got(2 * stride), want(2 * stride);
    for (int kb = 0; kb < s.k_padded / kernels::kBlockK; ++kb) {
      INFO("kb " << kb);
      std::fill(got.begin(), got.end(), bf16{0x7777});
      std::fill(want.begin(), want.end(), bf16{0x7777});
      transpose(s, v, 0, s.panels, kb, got.data(), stride);
      kernels::pack_transposed_kblock_int_portable(s, v, 0, s.panels, kb, want.data(), stride);
      REQUIRE(got == want);
    }
  }
}

}  // namespace tilemoe::test
