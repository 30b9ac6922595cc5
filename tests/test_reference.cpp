// The reference path against PyTorch + PEFT (the fixtures) and against finite differences.
#include <tuple>

#include "catch.hpp"
#include "fixture_cases.hpp"
#include "src/io/safetensors.hpp"
#include "src/layer/synthetic_layer.hpp"
#include "src/lora/lora_file.hpp"
#include "src/lora/peft_adapter.hpp"
#include "src/model/checkpoint.hpp"
#include "src/reference/moe_reference.hpp"
#include "test_util.hpp"
#include "tilemoe/error.hpp"

using namespace tilemoe;
using tilemoe::test::rel_error;

namespace {

void check_case_layer(const Checkpoint& ck, const LoadedLora& lora, const io::SafetensorsFile& ref, int layer) {
  std::string p = "layer_" + std::to_string(layer) + ".";
  auto x = io::read_as_f32(ref, p + "input");
  auto ids = io::read_as_i64(ref, p + "expert_ids");
  auto wts = io::read_as_f32(ref, p + "weights");
  auto dy = io::read_as_f32(ref, p + "grad_output");
  auto want_y = io::read_as_f32(ref, p + "output");
  auto want_dx = io::read_as_f32(ref, p + "grad_input");
  const auto& xi = ref.get(p + "input");
  int T = static_cast<int>(xi.shape[0]), k = static_cast<int>(ref.get(p + "expert_ids").shape[1]);
  auto experts = ck.load_layer_experts(layer);
  MoeBatch<float> batch{T, k, x.data(), ids.data(), wts.data()};
  std::vector<float> y(x.size()), dx(x.size());
  reference_forward(experts.view(), lora.lora, batch, y.data());
  LayerLora grads = lora.lora.zeros_like();
  reference_backward(experts.view(), lora.lora, batch, dy.data(), dx.data(), &grads);
  INFO("layer " << layer);
  CHECK(rel_error(y, want_y) <= 1e-2);
  CHECK(rel_error(dx, want_dx) <= 1e-2);
  CHECK(rel_error(y, want_y) <= 1e-4);  // float32 against float32: far inside the contract
  for (Projection proj : kProjections) {
    REQUIRE(grads[proj].rank > 0);
    for (int e = 0; e < ck.config().shape.num_experts; ++e) REQUIRE(grads[proj].present[e]);
  }
  test::check_fixture_lora_grads(grads, lora, ref, ck.config().shape.num_experts);
}

}  // namespace

TEST_CASE("reference path matches PyTorch + PEFT on every fixture case", "[reference][fixtures]") {
  for (const auto& c : test::fixture_cases()) {
    SECTION(c.name) {
      auto ck = Checkpoint::open(c.dir + "/model");
      auto ref = io::SafetensorsFile::open(c.dir + "/reference.safetensors");
      for (int layer : c.layers) {
        LoadedLora lora = load_layer_lora(c.dir + "/adapter", ck.config(), layer);
        REQUIRE(lora.warnings.empty());
        check_case_layer(ck, lora, ref, layer);
      }
    }
  }
}

TEST_CASE("a converted LoRA file gives the same results as the PEFT adapter", "[reference][fixtures][convert]") {
  for (const auto& c : test::fixture_cases()) {
    SECTION(c.name) {
      auto ck = Checkpoint::open(c.dir + "/model");
      auto adapter = PeftAdapter::open(c.dir + "/adapter", ck.config());
      std::string out = test::temp_dir() + "/" + c.name + ".lora.safetensors";
      auto stats = convert_peft_to_lora_file(adapter, ck.config(), out);
      CHECK(stats.layers == static_cast<int>(c.layers.size()));
      auto ref = io::SafetensorsFile::open(c.dir + "/reference.safetensors");
      for (int layer : c.layers) {
        LoadedLora from_file = load_layer_lora(out, ck.config(), layer);
        LoadedLora from_peft = load_peft_layer(adapter, ck.config().shape, layer);
        for (Projection p : kProjections) {
          CHECK(from_file.lora[p].a == from_peft.lora[p].a);
          CHECK(from_file.lora[p].b == from_peft.lora[p].b);
          CHECK(from_file.lora[p].scale == from_peft.lora[p].scale);
          CHECK(from_file.key_a(p, 3) == from_peft.key_a(p, 3));
          CHECK(from_file.key_b(p, 0) == from_peft.key_b(p, 0));
        }
        check_case_layer(ck, from_file, ref, layer);
      }
    }
  }
}

namespace {

// Loss = sum(output * dy), in float64.
double loss(const ExpertWeightsView& w, const LayerLoraT<double>& lora, MoeBatch<double> b, const std::vector<double>& dy) {
  std::vector<double> y(dy.size());
  reference_forward(w, lora, b, y.data());
  double s = 0;
  for (std::size_t i = 0; i < y.size(); ++i) s += y[i] * dy[i];
  return s;
}

}  // namespace

TEST_CASE("reference backward equals finite differences in float64", "[reference][backward]") {
  // Tiny and awkward: expert 1 has no LoRA, expert 3 gets no token, one slot is routed elsewhere.
  // Without a swiglu_limit, and with one that clamps some gates and ups (DeepSeek-V4's SwiGLU); in
  // gpt-oss's form (alpha 1.702, up + 1, with the experts' biases random_expert_weights gives it).
  const auto [limit, alpha, offset] = GENERATE(std::tuple{0.0f, 1.0f, 0.0f}, std::tuple{0.4f, 1.0f, 0.0f},
                                               std::tuple{0.4f, 1.702f, 1.0f}, std::tuple{0.0f, 1.702f, 1.0f});
  INFO("swiglu_limit " << limit << " alpha " << alpha << " up_offset " << offset);
  MoeShape s{5, 7, 4, 2, limit, alpha, offset};
  auto w = random_expert_weights(s, 3);
  LayerLoraT<double> lora = random_lora(s, 3, 6.0f, 5).cast<double>();
  for (auto& p : lora.proj) {
    p.present[1] = 0;
    p.scale[1] = 0;
    for (auto& v : p.b) v *= 10;  // make the LoRA term matter
  }
  int T = 4;
  std::vector<std::int64_t> ids = {0, 1, 2, -1, 1, 0, 2, 0};
  std::vector<double> wts = {0.7, 0.3, 1.0, 0.5, 0.4, 0.6, 0.2, 0.8};
  auto xf = random_activations(static_cast<std::size_t>(T) * s.hidden, 9, 2.0f);
  auto dyf = random_activations(static_cast<std::size_t>(T) * s.hidden, 10);
  std::vector<double> x(xf.begin(), xf.end()), dy(dyf.begin(), dyf.end());
  MoeBatch<double> b{T, 2, x.data(), ids.data(), wts.data()};
  std::vector<double> dx(x.size());
  auto grads = lora.zeros_like();
  reference_backward(w.view(), lora, b, dy.data(), dx.data(), &grads);
  if (limit > 0) {
    // The limit must clamp something here, or this case checks nothing the first does not.
    ExpertWeightsView plain = w.view();
    plain.shape.swiglu_limit = 0;
    std::vector<double> y_clamped(x.size()), y_plain(x.size());
    reference_forward(w.view(), lora, b, y_clamped.data());
    reference_forward(plain, lora, b, y_plain.data());
    double most = 0;
    for (std::size_t i = 0; i < x.size(); ++i) most = std::max(most, std::abs(y_clamped[i] - y_plain[i]));
    REQUIRE(most > 1e-2);
  }

  const double h = 1e-6;
  auto fd = [&](double& v) {
    double keep = v;
    v = keep + h;
    double up = loss(w.view(), lora, b, dy);
    v = keep - h;
    double down = loss(w.view(), lora, b, dy);
    v = keep;
    return (up - down) / (2 * h);
  };
  for (std::size_t i = 0; i < x.size(); ++i) {
    double want = fd(x[i]);
    INFO("grad_input[" << i << "]");
    CHECK(std::abs(dx[i] - want) <= 1e-7 * (1 + std::abs(want)));
  }
  for (Projection p : kProjections) {
    for (std::size_t i = 0; i < lora[p].a.size(); ++i) {
      int e = static_cast<int>(i / (lora[p].rank * lora[p].in));
      double want = lora[p].present[e] ? fd(lora[p].a[i]) : 0.0;
      INFO(projection_name(p) << " A[" << i << "]");
      CHECK(std::abs(grads[p].a[i] - want) <= 1e-7 * (1 + std::abs(want)));
    }
    for (std::size_t i = 0; i < lora[p].b.size(); ++i) {
      int e = static_cast<int>(i / (lora[p].rank * lora[p].out));
      double want = lora[p].present[e] ? fd(lora[p].b[i]) : 0.0;
      INFO(projection_name(p) << " B[" << i << "]");
      CHECK(std::abs(grads[p].b[i] - want) <= 1e-7 * (1 + std::abs(want)));
    }
    for (int e : {1, 3})  // no LoRA / no token: exactly zero
      for (int i = 0; i < lora[p].rank * lora[p].in; ++i) CHECK(grads[p].a_of(e)[i] == 0.0);
  }
}

TEST_CASE("reference rejects out-of-range ids and propagates NaN activations", "[reference]") {
  MoeShape s{8, 6, 3, 2};
  auto w = random_expert_weights(s, 1);
  LayerLora none;
  std::vector<float> x(2 * 8, 0.5f), y(2 * 8), wts = {0.5f, 0.5f, 0.5f, 0.5f};
  std::vector<std::int64_t> bad = {0, 1, 2, 3};
  MoeBatch<float> b{2, 2, x.data(), bad.data(), wts.data()};
  try {
    reference_forward(w.view(), none, b, y.data());
    FAIL("no error for expert id 3 of 3");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::invalid_argument);
    CHECK(std::string(e.what()).find("expert_ids[1][1] = 3") != std::string::npos);
  }
  std::vector<std::int64_t> ok = {0, 1, -1, 2};
  x[3] = std::nanf("");
  b.expert_ids = ok.data();
  reference_forward(w.view(), none, b, y.data());
  for (int i = 0; i < 8; ++i) CHECK(std::isnan(y[i]));
  for (int i = 8; i < 16; ++i) CHECK(std::isfinite(y[i]));
}
