// The forward with int8/int4 base weights on the portable kernels; AVX512-VNNI and AMX-INT8 have
// their own files in tests/isa/ that report SKIPPED where the CPU lacks them.
#include "moe_forward_quantized_grid.hpp"

using namespace tilemoe;

TEST_CASE("portable int8/int4 forward equals the reference on dequantized weights", "[forward][quantized][portable]") {
  test::run_quantized_forward_grid(kernels::Isa::portable);
}
TEST_CASE("portable int8/int4 forward matches the fixtures", "[forward][quantized][portable][fixtures]") {
  test::run_quantized_fixture_forward(kernels::Isa::portable);
}
TEST_CASE("portable int8/int4 forward with ranks of their own for gate, up and down", "[forward][quantized][lora]") {
  test::run_quantized_projection_ranks(kernels::Isa::portable);
}
TEST_CASE("portable int8/int4 forward packs a held LoRA set once", "[forward][quantized][lora]") {
  test::run_quantized_held_lora(kernels::Isa::portable);
}
TEST_CASE("portable int8/int4 forward: same bits for any thread count, NaN stays in its token", "[forward][quantized][portable]") {
  test::run_quantized_identity_and_nan(kernels::Isa::portable, {1, 2, 3});
}
TEST_CASE("quantization error on Gaussian weights is within the bars", "[forward][quantized]") {
  test::run_quantization_error(kernels::Isa::portable);
}

// The bench's bandwidth floor counts streamed_bytes(): the codes and the smaller form of their
// scales. Figured here from the shapes alone (awkward sizes: n and k padded to 16 and 64).
TEST_CASE("streamed bytes are the codes and one form of their scales", "[forward][quantized]") {
  numa::ThreadPool& pool = pool_for_threads(0);
  const MoeShape s{40, 70, 3, 2};  // hidden 40, intermediate 70, 3 experts
  auto w = random_expert_weights(s, 91);
  const auto bf = PackedExpertWeights::pack(w.view(), pool);
  CHECK(bf.streamed_bytes() == bf.bytes());
  for (const test::QuantCase& qc : test::kQuantCases) {
    CAPTURE(static_cast<int>(qc.type), qc.group);
    auto q = quant::quantize_experts(w.view(), qc.type, qc.group, &pool);
    // int4: expert 1's second scale made 1.37 times what it was, so that where a row has two
    // groups its scales no longer decompose and it counts its f32 scales.
    if (qc.type == WeightType::int4)
      for (auto& proj : q.proj) proj.scales_of(1)[1] *= 1.37f;
    const auto packed = PackedExpertWeights::pack_quantized(q, pool);
    if (qc.type == WeightType::int4 && qc.group == 32) CHECK(packed.packed_int(Projection::gate, 1).group_multiples == nullptr);
    std::size_t want = 0;
    for (int e = 0; e < s.num_experts; ++e)
      for (Projection p : {Projection::gate, Projection::up, Projection::down}) {
        const int n = p == Projection::down ? s.hidden : s.intermediate, k = p == Projection::down ? s.intermediate : s.hidden;
        const std::size_t n_padded = (n + 15) / 16 * 16, k_padded = (k + 63) / 64 * 64;
        if (qc.type == WeightType::mxfp4) {
          want += n_padded * ((k + 31) / 32 * 32) / 2 + n_padded * ((k + 31) / 32);  // E2M1 nibbles, one E8M0 a 32
          continue;
        }
        const std::size_t groups = qc.type == WeightType::int8 ? 1 : (k_padded + qc.group - 1) / qc.group;
        const std::size_t codes = n_padded * k_padded / (qc.type == WeightType::int8 ? 1 : 2);
        const std::size_t scales = n_padded * groups * 4;
        // int4 in column form: a byte a group and column, and one f32 a column.
        const std::size_t column_form = n_padded * groups + n_padded * 4;
        const bool has_columns = qc.type == WeightType::int4 && packed.packed_int(p, e).group_multiples != nullptr;
        want += codes + (has_columns ? std::min(scales, column_form) : scales);
      }
    CHECK(packed.streamed_bytes() == want);
    if (is_integer_weight_type(qc.type)) CHECK(packed.streamed_bytes() < packed.bytes());  // column sums left out
  }
}
