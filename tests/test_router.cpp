// The checkpoint's router: the fixtures' PyTorch routing, hand-computed DeepSeek-V2/V3 cases,
// a step-by-step transcription of transformers' code on random configs, and clear errors.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

#include "catch.hpp"
#include "test_util.hpp"
#include "fixture_cases.hpp"
#include "numa/thread_pool.hpp"
#include "src/io/safetensors.hpp"
#include "src/layer/moe_compute.hpp"
#include "src/layer/synthetic_layer.hpp"
#include "src/model/checkpoint.hpp"
#include "src/routing/router.hpp"
#include "tilemoe/error.hpp"

using namespace tilemoe;

namespace {

using test::error_of;

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// A router whose logits are the hidden state itself (weight = identity, H = E): the cases below
// set the logits directly, with values bf16 holds exactly.
struct IdentityRouter {
  ModelConfig config;
  RouterWeights weights;
  explicit IdentityRouter(int experts, int top_k) {
    config.model_type = "test";
    config.shape = MoeShape{experts, 1, experts, top_k};
    weights.weight.assign(static_cast<std::size_t>(experts) * experts, 0.0f);
    for (int e = 0; e < experts; ++e) weights.weight[static_cast<std::size_t>(e) * experts + e] = 1.0f;
  }
  Routing route(const std::vector<float>& logits) const {
    std::vector<bf16> x;
    for (float v : logits) x.push_back(float_to_bf16(v));
    REQUIRE(static_cast<int>(x.size()) % config.shape.hidden == 0);
    return route_tokens(config, weights, 7, x.data(), static_cast<int>(x.size()) / config.shape.hidden);
  }
};

// transformers' routers transcribed step by step (full sorts, no shared helpers), to check the
// runtime's on random configs: softmax or sigmoid, e_score_correction_bias added for choosing,
// groups scored by their max (group_limited_greedy) or best two (noaux_tc), masked to 0.0,
// top-k, weights from the unbiased scores (noaux_tc) or topk's values, renormalised, scaled.
void naive_route(const ModelConfig& c, const RouterWeights& r, const std::vector<bf16>& x, int token, std::vector<std::int64_t>& ids,
                 std::vector<float>& weights) {
  const int E = c.shape.num_experts, H = c.shape.hidden, k = c.shape.top_k;
  std::vector<float> logits(E), scores(E);
  for (int e = 0; e < E; ++e) {
    long double s = 0;
    for (int h = 0; h < H; ++h) s += static_cast<long double>(bf16_to_float(x[static_cast<std::size_t>(token) * H + h])) * r.weight[static_cast<std::size_t>(e) * H + h];
    logits[e] = static_cast<float>(s);
  }
  if (c.scoring_func == "softmax") {
    double m = *std::max_element(logits.begin(), logits.end()), sum = 0;
    for (int e = 0; e < E; ++e) sum += std::exp(logits[e] - m);
    for (int e = 0; e < E; ++e) scores[e] = static_cast<float>(std::exp(logits[e] - m) / sum);
  } else {
    for (int e = 0; e < E; ++e) scores[e] = static_cast<float>(sigmoid(logits[e]));
  }
  std::vector<float> for_choice = scores;
  bool v3 = c.topk_method == "noaux_tc";
  if (v3 && !r.correction_bias.empty())
    for (int e = 0; e < E; ++e) for_choice[e] += r.correction_bias[e];
  auto order_desc = [](const std::vector<float>& v) {
    std::vector<int> idx(v.size());
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return v[a] > v[b]; });
    return idx;
  };
  if (c.topk_method != "greedy") {
    int per = E / c.n_group;
    std::vector<float> group_scores(c.n_group);
    for (int g = 0; g < c.n_group; ++g) {
      std::vector<float> members(for_choice.begin() + g * per, for_choice.begin() + (g + 1) * per);
      std::sort(members.begin(), members.end(), std::greater<float>());
      group_scores[g] = v3 ? members[0] + members[1] : members[0];
    }
    auto group_order = order_desc(group_scores);
    std::set<int> kept(group_order.begin(), group_order.begin() + c.topk_group);
    for (int e = 0; e < E; ++e)
      if (!kept.count(e / per)) for_choice[e] = 0.0f;
  }
  auto order = order_desc(for_choice);
  std::vector<float> w;
  for (int j = 0; j < k; ++j) {
    ids.push_back(order[j]);
    w.push_back(v3 ? scores[order[j]] : for_choice[order[j]]);
  }
  if (c.norm_topk_prob) {
    float sum = 0;
    for (float v : w) sum += v;
    for (float& v : w) v /= sum + 1e-20f;
  }
  for (float v : w) weights.push_back(v * static_cast<float>(c.routed_scaling_factor));
}

}  // namespace

TEST_CASE("the router reproduces every fixture's PyTorch routing", "[router][fixtures]") {
  for (const auto& c : test::fixture_cases()) {
    SECTION(c.name) {
      auto ck = Checkpoint::open(c.dir + "/model");
      auto ref = io::SafetensorsFile::open(c.dir + "/reference.safetensors");
      for (int layer : c.layers) {
        INFO(c.name << " layer " << layer);
        REQUIRE(ref.get("layer_" + std::to_string(layer) + ".input").dtype == io::Dtype::BF16);
        test::FixtureLayerInputs in = test::read_fixture_layer(ref, layer);
        const auto& x = in.input_bf16;
        const auto& want_ids = in.expert_ids;
        const auto& want_w = in.weights;
        const int k = ck.config().shape.top_k, T = static_cast<int>(x.size()) / ck.config().shape.hidden;
        REQUIRE(want_ids.size() == static_cast<std::size_t>(T) * k);
        Routing got = route_tokens(ck.config(), ck.load_router(layer), layer, x.data(), T);
        REQUIRE(got.tokens == T);
        REQUIRE(got.top_k == k);
        for (int t = 0; t < T; ++t) {
          // The fixtures hold the plain softmax top-k for every model; transformers' Mixtral
          // renormalises it (norm_topk_prob), so there the fixture's weights are renormalised here.
          float sum = 0;
          for (int j = 0; j < k; ++j) sum += want_w[t * k + j];
          for (int j = 0; j < k; ++j) {
            INFO("token " << t << " slot " << j);
            // Same expert in the same slot (PyTorch's topk is sorted too), then the same weight.
            CHECK(got.expert_ids[t * k + j] == want_ids[t * k + j]);
            float w = want_w[t * k + j] / (ck.config().norm_topk_prob ? sum : 1.0f);
            CHECK(std::abs(got.weights[t * k + j] - w) <= 1e-4f * std::abs(w));
          }
        }
        // The pool only spreads tokens: same bits.
        Routing pooled = route_tokens(ck.config(), ck.load_router(layer), layer, x.data(), T, &pool_for_threads(0));
        CHECK(pooled.expert_ids == got.expert_ids);
        CHECK(pooled.weights == got.weights);
      }
    }
  }
}

TEST_CASE("model types set the router as transformers runs it", "[router][config]") {
  auto v3 = parse_model_config(R"({"model_type":"deepseek_v3","hidden_size":64,"moe_intermediate_size":32,"n_routed_experts":16,
    "num_experts_per_tok":4,"num_hidden_layers":2,"scoring_func":"softmax","topk_method":"greedy"})", "v3");
  CHECK(v3.scoring_func == "sigmoid");  // DeepseekV3TopkRouter knows nothing else
  CHECK(v3.topk_method == "noaux_tc");
  CHECK(v3.n_group == 8);
  CHECK(v3.topk_group == 4);
  CHECK(v3.norm_topk_prob);
  CHECK(v3.routed_scaling_factor == 2.5);
  auto v2 = parse_model_config(R"({"model_type":"deepseek_v2","hidden_size":64,"moe_intermediate_size":32,"n_routed_experts":16,
    "num_experts_per_tok":4,"num_hidden_layers":2,"topk_method":"group_limited_greedy","n_group":4,"topk_group":2,
    "norm_topk_prob":true,"routed_scaling_factor":16.0})", "v2");
  CHECK(v2.scoring_func == "softmax");
  CHECK(v2.topk_method == "group_limited_greedy");
  CHECK_FALSE(v2.norm_topk_prob);  // DeepseekV2Moe ignores it
  CHECK(v2.routed_scaling_factor == 16.0);
  CHECK(v2.n_group == 4);
  auto qwen3 = parse_model_config(R"({"model_type":"qwen3_moe","hidden_size":64,"moe_intermediate_size":32,"num_experts":16,
    "num_experts_per_tok":4,"num_hidden_layers":2})", "q");
  CHECK_FALSE(qwen3.norm_topk_prob);  // Qwen3MoeConfig's default; released checkpoints write true
  auto mixtral = parse_model_config(R"({"model_type":"mixtral","hidden_size":64,"intermediate_size":32,"num_local_experts":8,
    "num_experts_per_tok":2,"num_hidden_layers":2,"norm_topk_prob":false})", "m");
  CHECK(mixtral.norm_topk_prob);
  CHECK(mixtral.routed_scaling_factor == 1.0);

  // DeepSeek-V3's router under other names, with each config class's defaults where config.json
  // leaves a field out (checked against transformers v5's routers on the device).
  struct Sigmoid {
    const char* json;
    int n_group, topk_group;
    bool norm;
    double scale;
  };
  const Sigmoid sigmoid_types[] = {
      {R"({"model_type":"deepseek_v32","hidden_size":64,"moe_intermediate_size":32,"n_routed_experts":16,"num_experts_per_tok":4,
          "num_hidden_layers":2})", 8, 4, true, 2.5},
      {R"({"model_type":"glm4_moe_lite","hidden_size":64,"moe_intermediate_size":32,"n_routed_experts":16,"num_experts_per_tok":4,
          "num_hidden_layers":2})", 1, 1, true, 1.8},
      {R"({"model_type":"dots1","hidden_size":64,"moe_intermediate_size":32,"n_routed_experts":16,"num_experts_per_tok":4,
          "num_hidden_layers":2,"scoring_func":"softmax"})", 1, 1, false, 1.0},
      {R"({"model_type":"exaone_moe","hidden_size":64,"moe_intermediate_size":32,"num_experts":16,"num_experts_per_tok":4,
          "num_hidden_layers":3,"n_group":2,"topk_group":1,"mlp_layer_types":["dense","sparse","sparse"]})", 2, 1, true, 2.5},
      {R"({"model_type":"minimax_m2","hidden_size":64,"intermediate_size":32,"num_local_experts":16,"num_experts_per_tok":4,
          "num_hidden_layers":2,"routed_scaling_factor":3.0})", 1, 1, true, 1.0},
  };
  for (const auto& t : sigmoid_types) {
    auto c = parse_model_config(t.json, "sigmoid");
    INFO(c.model_type);
    CHECK(c.scoring_func == "sigmoid");
    CHECK(c.topk_method == "noaux_tc");
    CHECK(c.n_group == t.n_group);
    CHECK(c.topk_group == t.topk_group);
    CHECK(c.norm_topk_prob == t.norm);
    CHECK(c.routed_scaling_factor == t.scale);
    CHECK(c.shape.intermediate == 32);
    CHECK(c.shape.num_experts == 16);
    CHECK(c.routing_unsupported.empty());
  }
  CHECK(parse_model_config(sigmoid_types[3].json, "exaone").moe_layers == std::vector<int>{1, 2});
  CHECK(error_of([] {
          parse_model_config(R"({"model_type":"exaone_moe","hidden_size":64,"moe_intermediate_size":32,"num_experts":16,
            "num_experts_per_tok":4,"num_hidden_layers":2,"mlp_layer_types":["dense","moe"]})", "e.json");
        }).find("e.json: mlp_layer_types[1] is \"moe\", not \"sparse\" or \"dense\"") == 0);
  // Routers it does not compute: the experts load, routing by the router is refused naming the type.
  auto phi = parse_model_config(R"({"model_type":"phimoe","hidden_size":64,"intermediate_size":32,"num_local_experts":8,
    "num_experts_per_tok":2,"num_hidden_layers":2})", "phi");
  CHECK(phi.shape.num_experts == 8);
  CHECK(phi.routing_unsupported.find("sparsemixer") != std::string::npos);
  RouterWeights w;
  w.weight.assign(8 * 64, 0.1f);
  std::vector<bf16> x(64, float_to_bf16(0.5f));
  CHECK(error_of([&] { route_tokens(phi, w, 1, x.data(), 1); }).find("layer 1 router: model_type 'phimoe': PhiMoE routes with sparsemixer") == 0);
}

TEST_CASE("ERNIE-4.5: softmax scores, chosen with the moe_statics bias, weighed without it", "[router][config]") {
  auto ernie = parse_model_config(R"({"model_type":"ernie4_5_moe","hidden_size":4,"moe_intermediate_size":8,"moe_num_experts":4,
    "moe_k":2,"num_hidden_layers":2})", "ernie");
  IdentityRouter r(4, 2);
  r.config.scoring_func = ernie.scoring_func;
  r.config.topk_method = ernie.topk_method;
  r.config.norm_topk_prob = ernie.norm_topk_prob;
  r.config.routed_scaling_factor = ernie.routed_scaling_factor;
  r.weights.correction_bias = {0.0f, 0.0f, 1.0f, 0.0f};
  std::vector<float> logits{2.0f, 1.0f, 0.5f, 0.0f};
  // softmax scores s; expert 2 wins by its bias, then expert 0; weights s2 and s0 renormalised
  double z = std::exp(2.0) + std::exp(1.0) + std::exp(0.5) + 1.0, s0 = std::exp(2.0) / z, s2 = std::exp(0.5) / z;
  auto got = r.route(logits);
  CHECK(got.expert_ids == std::vector<std::int64_t>{2, 0});
  CHECK(got.weights[0] == Approx(s2 / (s0 + s2)).epsilon(1e-6));
  CHECK(got.weights[1] == Approx(s0 / (s0 + s2)).epsilon(1e-6));
}

TEST_CASE("Kimi-Linear masks experts outside the chosen groups to -inf, DeepSeek-V3 to 0.0", "[router]") {
  IdentityRouter r(4, 2);  // 2 groups of 2
  r.config.scoring_func = "sigmoid";
  r.config.topk_method = "noaux_tc";
  r.config.n_group = 2;
  r.config.topk_group = 1;
  // Group 0 (experts 0, 1) wins by its best two; its expert 1 is pushed below 0 by the bias, so
  // DeepSeek-V3's 0.0 lets expert 2 of the other group in, Kimi-Linear's -inf does not.
  r.weights.correction_bias = {0.0f, -0.8f, -0.9f, -0.9f};
  std::vector<float> logits{4.0f, -4.0f, 0.0f, 0.0f};
  CHECK(r.route(logits).expert_ids == std::vector<std::int64_t>{0, 2});
  r.config.unchosen_groups_neg_inf = true;
  CHECK(r.route(logits).expert_ids == std::vector<std::int64_t>{0, 1});
}

TEST_CASE("softmax top-k, renormalised or not", "[router]") {
  IdentityRouter r(4, 2);
  std::vector<float> logits{0.5f, 2.0f, -1.0f, 2.0f};  // experts 1 and 3 tie: the lower id comes first
  double z = std::exp(0.5) + 2 * std::exp(2.0) + std::exp(-1.0);
  auto plain = r.route(logits);
  CHECK(plain.expert_ids == std::vector<std::int64_t>{1, 3});
  CHECK(plain.weights[0] == Approx(std::exp(2.0) / z).epsilon(1e-6));
  CHECK(plain.weights[1] == plain.weights[0]);
  r.config.norm_topk_prob = true;
  auto normed = r.route(logits);
  CHECK(normed.expert_ids == plain.expert_ids);
  CHECK(normed.weights[0] == Approx(0.5).epsilon(1e-6));
  CHECK(normed.weights[1] == Approx(0.5).epsilon(1e-6));
}

TEST_CASE("DeepSeek-V2 group_limited_greedy: groups by their best expert, weights times the scaling factor", "[router]") {
  IdentityRouter r(6, 2);  // 3 groups of 2
  r.config.topk_method = "group_limited_greedy";
  r.config.n_group = 3;
  r.config.topk_group = 1;
  std::vector<float> logits{1.0f, 0.0f, 0.5f, 0.75f, 2.0f, -3.0f};
  double z = 0;
  for (float l : logits) z += std::exp(l);
  auto p = [&](int e) { return std::exp(static_cast<double>(logits[e])) / z; };
  // Group 2 holds the best expert (4): only its two experts may be chosen, though expert 0 beats 5.
  auto one_group = r.route(logits);
  CHECK(one_group.expert_ids == std::vector<std::int64_t>{4, 5});
  CHECK(one_group.weights[0] == Approx(p(4)).epsilon(1e-6));
  CHECK(one_group.weights[1] == Approx(p(5)).epsilon(1e-6));
  r.config.topk_group = 2;  // groups 2 and 0
  auto two_groups = r.route(logits);
  CHECK(two_groups.expert_ids == std::vector<std::int64_t>{4, 0});
  r.config.topk_method = "greedy";
  CHECK(r.route(logits).expert_ids == two_groups.expert_ids);
  r.config.topk_method = "group_limited_greedy";
  r.config.routed_scaling_factor = 16.0;  // a power of two: exactly 16x
  auto scaled = r.route(logits);
  CHECK(scaled.expert_ids == two_groups.expert_ids);
  CHECK(scaled.weights[0] == 16.0f * two_groups.weights[0]);
  CHECK(scaled.weights[1] == 16.0f * two_groups.weights[1]);
}

TEST_CASE("DeepSeek-V3 noaux_tc: the correction bias chooses, the unbiased sigmoid weighs", "[router]") {
  IdentityRouter r(8, 2);  // 4 groups of 2, the best 2 groups kept
  r.config.scoring_func = "sigmoid";
  r.config.topk_method = "noaux_tc";
  r.config.n_group = 4;
  r.config.topk_group = 2;
  r.config.norm_topk_prob = true;
  r.config.routed_scaling_factor = 2.5;
  std::vector<float> logits{2.0f, 1.0f, 0.5f, 0.25f, -1.0f, 3.0f, 0.0f, -2.0f};
  auto s = [&](int e) { return sigmoid(logits[e]); };
  auto normed = [&](int a, int b) { return std::pair{2.5 * s(a) / (s(a) + s(b)), 2.5 * s(b) / (s(a) + s(b))}; };

  // No bias: group scores (sum of both) are 1.61, 1.18, 1.22, 0.62: groups 0 and 2; experts 5 and 0.
  auto plain = r.route(logits);
  CHECK(plain.expert_ids == std::vector<std::int64_t>{5, 0});
  CHECK(plain.weights[0] == Approx(normed(5, 0).first).epsilon(1e-6));
  CHECK(plain.weights[1] == Approx(normed(5, 0).second).epsilon(1e-6));

  // The same bias everywhere changes no choice and, not entering the weights, no weight.
  r.weights.correction_bias.assign(8, 0.125f);
  auto shifted = r.route(logits);
  CHECK(shifted.expert_ids == plain.expert_ids);
  CHECK(shifted.weights == plain.weights);

  // Expert 5 biased down by 0.5: group 2 drops to 0.72, groups 0 and 1 win and experts 0 and 1
  // are chosen; their weights are their own unbiased sigmoids, renormalised and scaled.
  r.weights.correction_bias.assign(8, 0.0f);
  r.weights.correction_bias[5] = -0.5f;
  auto biased = r.route(logits);
  CHECK(biased.expert_ids == std::vector<std::int64_t>{0, 1});
  CHECK(biased.weights[0] == Approx(normed(0, 1).first).epsilon(1e-6));
  CHECK(biased.weights[1] == Approx(normed(0, 1).second).epsilon(1e-6));

  // Without renormalising: the raw sigmoids times 2.5.
  r.config.norm_topk_prob = false;
  auto raw = r.route(logits);
  CHECK(raw.expert_ids == biased.expert_ids);
  CHECK(raw.weights[0] == Approx(2.5 * s(0)).epsilon(1e-6));
  CHECK(raw.weights[1] == Approx(2.5 * s(1)).epsilon(1e-6));

  // greedy ignores the bias (DeepSeek-V2 checkpoints do not have one)
  r.config.topk_method = "greedy";
  CHECK(r.route(logits).expert_ids == std::vector<std::int64_t>{5, 0});
}

TEST_CASE("DeepSeek-V4: sqrt(softplus) scores, chosen with the bias; hash-routed layers refused", "[router]") {
  IdentityRouter r(6, 2);
  r.config = parse_model_config(R"({"model_type":"deepseek_v4","hidden_size":6,"moe_intermediate_size":4,"n_routed_experts":6,
    "num_experts_per_tok":2,"num_hidden_layers":9,"mlp_layer_types":["moe","moe","moe","moe","moe","moe","moe","hash_moe","moe"]})", "v4");
  // Logits above softplus's threshold (20) count as themselves, as in torch.
  std::vector<float> logits{2.0f, -1.0f, 0.5f, 24.0f, -3.0f, 1.0f};
  auto s = [&](int e) { return logits[e] > 20 ? std::sqrt(static_cast<double>(logits[e])) : std::sqrt(std::log1p(std::exp(logits[e]))); };
  r.weights.correction_bias = {0.0f, 0.0f, 0.0f, -10.0f, 0.0f, 0.0f};  // expert 3 would win unbiased
  // Layer 7 of this config is hash-routed: refused, naming why.
  std::vector<bf16> x;
  for (float v : logits) x.push_back(float_to_bf16(v));
  CHECK(error_of([&] { route_tokens(r.config, r.weights, 7, x.data(), 1); }).find("chooses its experts by token id") != std::string::npos);
  auto routed = route_tokens(r.config, r.weights, 8, x.data(), 1);
  CHECK(routed.expert_ids == std::vector<std::int64_t>{0, 5});
  const double sum = s(0) + s(5);
  CHECK(routed.weights[0] == Approx(1.5 * s(0) / sum).epsilon(1e-6));
  CHECK(routed.weights[1] == Approx(1.5 * s(5) / sum).epsilon(1e-6));
  r.weights.correction_bias.clear();
  auto unbiased = route_tokens(r.config, r.weights, 8, x.data(), 1);
  CHECK(unbiased.expert_ids == std::vector<std::int64_t>{3, 0});
  CHECK(unbiased.weights[0] == Approx(1.5 * s(3) / (s(3) + s(0))).epsilon(1e-6));
}

TEST_CASE("noaux_tc masks the other groups with 0.0, as transformers does", "[router]") {
  // Every biased score is negative: the masked experts (0.0) then beat the kept group's, so they
  // are chosen, ties to the lower id, and weighted by their unbiased sigmoid. DeepSeek's own
  // inference code masks with -inf instead; tilemoe follows transformers.
  IdentityRouter r(4, 2);
  r.config.scoring_func = "sigmoid";
  r.config.topk_method = "noaux_tc";
  r.config.n_group = 2;
  r.config.topk_group = 1;
  r.weights.correction_bias = {-1.5f, -1.5f, -2.0f, -2.0f};
  auto got = r.route({3.0f, 2.0f, 3.0f, 2.0f});
  CHECK(got.expert_ids == std::vector<std::int64_t>{2, 3});
  CHECK(got.weights[0] == Approx(sigmoid(3.0)).epsilon(1e-6));
  CHECK(got.weights[1] == Approx(sigmoid(2.0)).epsilon(1e-6));
}

TEST_CASE("the router agrees with a step-by-step transcription on random configs", "[router]") {
  struct Case {
    const char* scoring;
    const char* method;
    int experts, top_k, n_group, topk_group;
    bool norm, bias;
    double scale;
  };
  for (const Case& cs : {Case{"softmax", "greedy", 16, 4, 1, 1, false, false, 1.0}, Case{"softmax", "greedy", 60, 6, 1, 1, true, false, 1.0},
                         Case{"softmax", "group_limited_greedy", 32, 6, 8, 3, false, false, 16.0},
                         Case{"sigmoid", "noaux_tc", 64, 8, 8, 4, true, true, 2.5}, Case{"sigmoid", "noaux_tc", 24, 3, 4, 2, false, true, 1.5},
                         Case{"sigmoid", "noaux_tc", 16, 2, 1, 1, true, false, 1.0}}) {
    INFO(cs.scoring << " " << cs.method << " E=" << cs.experts << " k=" << cs.top_k << " groups " << cs.n_group << "/" << cs.topk_group);
    ModelConfig c;
    c.shape = MoeShape{96, 1, cs.experts, cs.top_k};
    c.scoring_func = cs.scoring;
    c.topk_method = cs.method;
    c.n_group = cs.n_group;
    c.topk_group = cs.topk_group;
    c.norm_topk_prob = cs.norm;
    c.routed_scaling_factor = cs.scale;
    RouterWeights r;
    r.weight = random_activations(static_cast<std::size_t>(cs.experts) * 96, 11, 0.3f);
    if (cs.bias) r.correction_bias = random_activations(static_cast<std::size_t>(cs.experts), 12, 0.2f);
    const int T = 40;
    auto xf = random_activations(static_cast<std::size_t>(T) * 96, 13, 1.5f);
    auto x = to_bf16(xf.data(), xf.size());
    Routing got = route_tokens(c, r, 3, x.data(), T);
    std::vector<std::int64_t> ids;
    std::vector<float> w;
    for (int t = 0; t < T; ++t) naive_route(c, r, x, t, ids, w);
    CHECK(got.expert_ids == ids);
    for (std::size_t i = 0; i < w.size(); ++i) CHECK(got.weights[i] == Approx(w[i]).epsilon(1e-5));
  }
}

TEST_CASE("router errors name the layer and what is wrong", "[router][errors]") {
  IdentityRouter base(8, 2);
  std::vector<bf16> x(8, float_to_bf16(0.5f));
  auto err = [&](const IdentityRouter& r) { return error_of([&] { route_tokens(r.config, r.weights, 7, x.data(), 1); }); };
  auto kind = [&](const IdentityRouter& r) {
    try {
      route_tokens(r.config, r.weights, 7, x.data(), 1);
    } catch (const Error& e) {
      return e.kind();
    }
    return ErrorKind::state;
  };
  {
    auto r = base;
    r.weights.weight.pop_back();
    CHECK(err(r).find("layer 7 router: weight has 63 values, expected [8, 8]") != std::string::npos);
    CHECK(kind(r) == ErrorKind::bad_file);
    CHECK(error_of([&] { check_router(r.config, r.weights, 7); }) == err(r));
  }
  {
    auto r = base;
    r.config.topk_method = "noaux_tc";
    r.config.scoring_func = "sigmoid";
    r.config.n_group = 2;
    r.weights.correction_bias.assign(7, 0.0f);
    CHECK(err(r).find("layer 7 router: e_score_correction_bias has 7 values, expected 8") != std::string::npos);
    r.weights.correction_bias.assign(8, 0.0f);
    r.weights.correction_bias[3] = std::nanf("");
    CHECK(err(r).find("e_score_correction_bias of expert 3 is not finite") != std::string::npos);
  }
  {
    auto r = base;
    r.weights.weight[9] = INFINITY;
    CHECK(err(r).find("weight of expert 1 is not finite at column 1") != std::string::npos);
  }
  {
    auto r = base;
    r.config.scoring_func = "relu";
    CHECK(err(r).find("layer 7 router: scoring_func 'relu' is not one tilemoe knows") != std::string::npos);
    CHECK(kind(r) == ErrorKind::invalid_argument);
  }
  {
    auto r = base;
    r.config.topk_method = "random";
    CHECK(err(r).find("topk_method 'random' is not one tilemoe knows") != std::string::npos);
  }
  {
    auto r = base;
    r.config.topk_method = "group_limited_greedy";
    r.config.n_group = 3;
    CHECK(err(r).find("layer 7 router: n_group 3 does not divide the 8 experts") != std::string::npos);
    r.config.n_group = 0;
    CHECK(err(r).find("n_group 0 does not divide") != std::string::npos);
    r.config.n_group = 4;
    r.config.topk_group = 5;
    CHECK(err(r).find("topk_group 5 is not in [1, n_group 4]") != std::string::npos);
    r.config.topk_group = 0;
    CHECK(err(r).find("topk_group 0 is not in [1, n_group 4]") != std::string::npos);
    r.config.n_group = 8;
    r.config.topk_group = 1;
    CHECK(err(r).find("topk_group 1 groups of 1 experts hold fewer than top_k 2") != std::string::npos);
    r.config.topk_group = 2;
    CHECK(err(r) == "(no error)");
    r.config.topk_method = "noaux_tc";  // a group's score is its best two
    CHECK(err(r).find("noaux_tc scores a group by its best two experts, but n_group 8 leaves 1 expert per group") != std::string::npos);
  }
  {
    auto r = base;
    r.config.shape.top_k = 9;
    CHECK(err(r).find("top_k 9, 8 experts") != std::string::npos);
    r.config.shape.top_k = 2;
    r.config.routed_scaling_factor = NAN;
    CHECK(err(r).find("routed_scaling_factor is not finite") != std::string::npos);
  }
  {
    std::vector<bf16> bad(16, float_to_bf16(0.5f));
    bad[12] = 0x7fc0;  // token 1 has a NaN: every logit of it is NaN (NaN * 0 is NaN)
    auto e = error_of([&] { route_tokens(base.config, base.weights, 7, bad.data(), 2); });
    CHECK(e.find("layer 7 router: token 1's logit for expert 0 is not finite") != std::string::npos);
    CHECK(error_of([&] { route_tokens(base.config, base.weights, 7, x.data(), -1); }).find("token count -1 is negative") != std::string::npos);
    CHECK(route_tokens(base.config, base.weights, 7, nullptr, 0).expert_ids.empty());
  }
}
