// Checkpoint, config and PEFT loading on hand-made directories: every naming, every error.
#include <filesystem>
#include <fstream>
#include <random>

#include "catch.hpp"
#include "src/io/safetensors_writer.hpp"
#include "src/layer/synthetic_layer.hpp"
#include "src/lora/held_adapter.hpp"
#include "src/lora/lora_file.hpp"
#include "src/lora/peft_adapter.hpp"
#include "src/model/checkpoint.hpp"
#include "src/model/tensor_names.hpp"
#include "src/reference/moe_reference.hpp"
#include "test_util.hpp"
#include "tilemoe/error.hpp"
#include "tilemoe/moe_layer.hpp"
#include "tilemoe/runtime.hpp"

using namespace tilemoe;
namespace fs = std::filesystem;

namespace {

const MoeShape kShape{24, 17, 3, 2};

std::vector<float> test_values(std::size_t n, int seed) { return random_activations(n, static_cast<std::uint64_t>(seed), 0.5f); }

std::string fresh_dir(const std::string& name) {
  std::string d = test::temp_dir() + "/" + name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

void write_text(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

std::string deepseek_config() {
  return R"({"model_type": "deepseek_v2", "hidden_size": 24, "moe_intermediate_size": 17, "n_routed_experts": 3,
             "num_experts_per_tok": 2, "num_hidden_layers": 3, "first_k_dense_replace": 1, "moe_layer_freq": 1})";
}

// A checkpoint with layer 1 and 2 experts under `prefix.layers.L.<block>.experts.E.<names>`.
std::string make_model(const std::string& name, const std::string& block, const std::array<const char*, 3>& proj_names,
                       std::vector<bf16>* poison = nullptr, bool skip_one = false, bool with_bias = false,
                       const std::string& correction_bias = "", const std::string& router_name = "gate.weight") {
  std::string d = fresh_dir(name);
  write_text(d + "/config.json", deepseek_config());
  static ExpertWeights w = random_expert_weights(kShape, 4);
  io::SafetensorsWriter f;
  std::size_t per = static_cast<std::size_t>(kShape.hidden) * kShape.intermediate;
  for (int layer : {1, 2})
    for (int e = 0; e < kShape.num_experts; ++e)
      for (Projection p : kProjections) {
        if (skip_one && layer == 1 && e == 2 && p == Projection::up) continue;
        const auto& src = p == Projection::gate ? w.gate : p == Projection::up ? w.up : w.down;
        const bf16* data = src.data() + per * e;
        if (poison && layer == 1 && e == 1 && p == Projection::down) data = poison->data();
        f.add("model.layers." + std::to_string(layer) + "." + block + ".experts." + std::to_string(e) + "." +
                  proj_names[static_cast<int>(p)] + ".weight",
              io::Dtype::BF16, {projection_out(kShape, p), projection_in(kShape, p)}, data);
      }
  static std::vector<bf16> router(static_cast<std::size_t>(kShape.num_experts) * kShape.hidden, float_to_bf16(0.25f));
  if (with_bias)
    f.add("model.layers.1." + block + ".experts.2." + proj_names[2] + ".bias", io::Dtype::BF16, {kShape.hidden}, router.data());
  f.add("model.layers.1." + block + "." + router_name, io::Dtype::BF16, {kShape.num_experts, kShape.hidden}, router.data());
  // under the block: "gate.e_score_correction_bias", "e_score_correction_bias" or ERNIE's "moe_statics..." of [1, E]
  if (!correction_bias.empty()) {
    std::vector<std::int64_t> shape{kShape.num_experts};
    if (correction_bias.rfind("moe_statics.", 0) == 0) shape.insert(shape.begin(), 1);
    f.add("model.layers.1." + block + "." + correction_bias, io::Dtype::BF16, shape, router.data());
  }
  f.add("model.layers.0.self_attn.q_proj.weight", io::Dtype::BF16, {kShape.num_experts, kShape.hidden}, router.data());
  f.write(d + "/model.safetensors");
  return d;
}

// A PEFT adapter for layer 1 (experts 0 and 2 only) with a custom key prefix.
std::string make_adapter(const std::string& name, const std::string& config, int rank_b_override = -1, int in_override = -1,
                         bool lora_bias = false) {
  std::string d = fresh_dir(name);
  write_text(d + "/adapter_config.json", config);
  static std::vector<std::vector<float>> keep;
  io::SafetensorsWriter f;
  int r = 4;
  for (int e : {0, 2})
    for (Projection p : kProjections) {
      std::string key = "base_model.model.language_model.layers.1.mlp.experts." + std::to_string(e) + "." +
                        (p == Projection::gate ? "gate_proj" : p == Projection::up ? "up_proj" : "down_proj");
      int in = in_override > 0 ? in_override : projection_in(kShape, p);
      int rb = rank_b_override > 0 ? rank_b_override : r;
      f.add_f32(key + ".lora_A.weight", {r, in}, test_values(static_cast<std::size_t>(r) * in, e + 1));
      f.add_f32(key + ".lora_B.weight", {projection_out(kShape, p), rb}, test_values(static_cast<std::size_t>(rb) * projection_out(kShape, p), e + 7));
      if (lora_bias) f.add_f32(key + ".lora_B.bias", {projection_out(kShape, p)}, test_values(static_cast<std::size_t>(projection_out(kShape, p)), e));
    }
  std::vector<float> attn(4 * 24, 0.1f);
  f.add_f32("base_model.model.language_model.layers.1.self_attn.q_proj.lora_A.weight", {4, 24}, attn);
  f.add_f32("base_model.model.language_model.layers.1.mlp.shared_experts.gate_proj.lora_A.weight", {4, 24}, attn);
  f.write(d + "/adapter_model.safetensors");
  return d;
}

}  // namespace



using test::error_of;

TEST_CASE("expert tensor names in every naming", "[names]") {
  auto a = parse_expert_tensor_name("model.layers.3.mlp.experts.17.down_proj.weight");
  REQUIRE(a);
  CHECK(a->layer == 3);
  CHECK(a->expert == 17);
  CHECK(a->projection == Projection::down);
  CHECK_FALSE(a->lora);
  auto b = parse_expert_tensor_name("base_model.model.model.layers.0.block_sparse_moe.experts.2.w3.lora_B.weight");
  REQUIRE(b);
  CHECK(b->projection == Projection::up);
  CHECK(b->lora == LoraFactor::b);
  auto c = parse_expert_tensor_name("x.layers.1.mlp.original_moe.experts.5.w1.lora_A.default.weight");
  REQUIRE(c);
  CHECK(c->projection == Projection::gate);
  CHECK(c->lora == LoraFactor::a);
  CHECK_FALSE(parse_expert_tensor_name("model.layers.1.mlp.shared_experts.gate_proj.weight"));
  CHECK_FALSE(parse_expert_tensor_name("model.layers.1.mlp.shared_expert.gate_proj.weight"));
  CHECK_FALSE(parse_expert_tensor_name("model.layers.1.self_attn.q_proj.lora_A.weight"));
  CHECK_FALSE(parse_expert_tensor_name("model.layers.1.mlp.experts.x.gate_proj.weight"));
  CHECK_FALSE(a->bias);
  CHECK_FALSE(parse_expert_tensor_name("model.layers.1.mlp.experts.1.gate_proj.weight_scale_inv"));
  // Biases are named, so that the loaders can refuse them.
  auto bias = parse_expert_tensor_name("model.layers.1.mlp.experts.1.gate_proj.bias");
  REQUIRE(bias);
  CHECK(bias->bias);
  CHECK_FALSE(bias->lora);
  auto lora_bias = parse_expert_tensor_name("base_model.model.model.layers.1.mlp.experts.1.down_proj.lora_B.default.bias");
  REQUIRE(lora_bias);
  CHECK(lora_bias->bias);
  CHECK(lora_bias->lora == LoraFactor::b);
  CHECK(expert_key_template("a.experts.12.w1.lora_A.weight", 12) == "a.experts.{E}.w1.lora_A.weight");
  CHECK(expand_expert_key_template("a.experts.{E}.w1", 3) == "a.experts.3.w1");
}

TEST_CASE("config.json of each model family", "[config]") {
  auto ds = parse_model_config(R"({"model_type":"deepseek_v3","hidden_size":7168,"moe_intermediate_size":2048,"n_routed_experts":256,
    "num_experts_per_tok":8,"num_hidden_layers":61,"first_k_dense_replace":3,"moe_layer_freq":1,"scoring_func":"sigmoid",
    "topk_method":"noaux_tc","n_group":8,"topk_group":4,"norm_topk_prob":true,"routed_scaling_factor":2.5})", "v3");
  CHECK(ds.shape.hidden == 7168);
  CHECK(ds.moe_layers.size() == 58);
  CHECK(ds.moe_layers.front() == 3);
  CHECK(ds.scoring_func == "sigmoid");
  CHECK(ds.n_group == 8);
  auto glm = parse_model_config(R"({"model_type":"glm4_moe","hidden_size":4096,"moe_intermediate_size":1408,"n_routed_experts":128,
    "num_experts_per_tok":8,"num_hidden_layers":46,"first_k_dense_replace":1,"routed_scaling_factor":1.0})", "glm");
  CHECK(glm.scoring_func == "sigmoid");  // Glm4MoeTopkRouter, whatever the config says
  CHECK(glm.topk_method == "noaux_tc");
  CHECK(glm.norm_topk_prob);
  CHECK(glm.n_group == 1);
  CHECK(glm.moe_layers.size() == 45);
  auto qw = parse_model_config(R"({"model_type":"qwen3_moe","hidden_size":2048,"moe_intermediate_size":768,"num_experts":128,
    "num_experts_per_tok":8,"num_hidden_layers":48,"decoder_sparse_step":1,"mlp_only_layers":[0, 5],"norm_topk_prob":true})", "qwen");
  CHECK(qw.shape.num_experts == 128);
  CHECK(qw.moe_layers.size() == 46);
  CHECK_FALSE(qw.is_moe_layer(5));
  CHECK(qw.norm_topk_prob);
  // transformers v5 writes Qwen3-MoE's expert count as num_local_experts, beside a dense intermediate_size.
  auto qw5 = parse_model_config(R"({"model_type":"qwen3_moe","hidden_size":2048,"intermediate_size":6144,"moe_intermediate_size":768,
    "num_local_experts":128,"num_experts_per_tok":8,"num_hidden_layers":48,"mlp_only_layers":[0],"norm_topk_prob":true})", "qwen v5");
  CHECK(qw5.shape.intermediate == 768);
  CHECK(qw5.shape.num_experts == 128);
  CHECK(qw5.moe_layers.size() == 47);
  CHECK(qw5.norm_topk_prob);
  auto mx = parse_model_config(R"({"model_type":"mixtral","hidden_size":4096,"intermediate_size":14336,"num_local_experts":8,
    "num_experts_per_tok":2,"num_hidden_layers":32})", "mixtral");
  CHECK(mx.shape.intermediate == 14336);
  CHECK(mx.moe_layers.size() == 32);
  // OLMoE: intermediate_size is the experts', every layer MoE, top-k renormalised only when asked;
  // the count under v4's name or v5's.
  for (const char* count : {"num_experts", "num_local_experts"}) {
    INFO(count);
    auto ol = parse_model_config(std::string(R"({"model_type":"olmoe","hidden_size":2048,"intermediate_size":1024,")") + count +
                                     R"(":64,"num_experts_per_tok":8,"num_hidden_layers":16,"norm_topk_prob":false})",
                                 "olmoe");
    CHECK(ol.shape.intermediate == 1024);
    CHECK(ol.shape.num_experts == 64);
    CHECK(ol.moe_layers.size() == 16);
    CHECK_FALSE(ol.norm_topk_prob);
    CHECK(ol.scoring_func == "softmax");
  }
  // ERNIE-4.5-MoE: its own names for the count and top-k, MoE layers from a start, to an end, every interval.
  auto er = parse_model_config(R"({"model_type":"ernie4_5_moe","hidden_size":2560,"intermediate_size":12288,"moe_intermediate_size":1536,
    "moe_num_experts":64,"moe_k":6,"num_hidden_layers":28,"moe_layer_start_index":1,"moe_layer_end_index":27,"moe_num_shared_experts":2})",
                               "ernie");
  CHECK(er.shape.intermediate == 1536);
  CHECK(er.shape.num_experts == 64);
  CHECK(er.shape.top_k == 6);
  CHECK(er.moe_layers.size() == 27);
  CHECK(er.moe_layers.front() == 1);
  CHECK(er.scoring_func == "softmax");
  CHECK(er.topk_method == "noaux_tc");
  CHECK(er.norm_topk_prob);
  CHECK(er.routing_unsupported.empty());
  auto er2 = parse_model_config(R"({"model_type":"ernie4_5_moe","hidden_size":64,"moe_intermediate_size":32,"moe_num_experts":8,
    "moe_k":2,"num_hidden_layers":6,"moe_layer_start_index":0,"moe_layer_end_index":-1,"moe_layer_interval":2})", "ernie");
  CHECK(er2.moe_layers == std::vector<int>{1, 3, 5});
  // Hunyuan-MoE: moe_topk and the experts' size may be one per layer, all equal.
  auto hy = parse_model_config(R"({"model_type":"hunyuan_v1_moe","hidden_size":4096,"intermediate_size":11008,"num_experts":64,
    "moe_topk":[8,8,8],"moe_intermediate_size":[3072,3072,3072],"num_hidden_layers":3})", "hunyuan");
  CHECK(hy.shape.top_k == 8);
  CHECK(hy.shape.intermediate == 3072);
  CHECK(hy.shape.num_experts == 64);
  CHECK(hy.moe_layers.size() == 3);
  CHECK(hy.norm_topk_prob);
  CHECK(hy.routing_unsupported.empty());
  CHECK(parse_model_config(R"({"model_type":"hunyuan_v1_moe","hidden_size":64,"intermediate_size":96,"num_experts":5,"moe_topk":2,
    "num_hidden_layers":2})", "hunyuan").shape.intermediate == 96);
  std::string err = error_of([] {
    parse_model_config(R"({"model_type":"hunyuan_v1_moe","hidden_size":64,"intermediate_size":96,"num_experts":5,"moe_topk":[2,1],
      "num_hidden_layers":2})", "hy.json");
  });
  CHECK(err.find("hy.json: field 'moe_topk' is [2,1]: a value that differs by layer") == 0);
  // GraniteMoE: Mixtral's fields and router.
  auto gr = parse_model_config(R"({"model_type":"granitemoe","hidden_size":1024,"intermediate_size":512,"num_local_experts":32,
    "num_experts_per_tok":8,"num_hidden_layers":24,"hidden_act":"silu"})", "granite");
  CHECK(gr.shape.intermediate == 512);
  CHECK(gr.moe_layers.size() == 24);
  CHECK(gr.norm_topk_prob);
  CHECK(gr.routing_unsupported.empty());
  // A named type whose router tilemoe has not checked: the experts read, routing refused, unless it
  // is remote code stating its router.
  auto unknown = parse_model_config(R"({"model_type":"laguna","hidden_size":64,"moe_intermediate_size":32,"num_experts":8,
    "num_experts_per_tok":2,"num_hidden_layers":2})", "laguna");
  CHECK(unknown.shape.num_experts == 8);
  CHECK(unknown.routing_unsupported.find("has not checked this type's router") != std::string::npos);
  auto fresh = parse_model_config(R"({"model_type":"brand_new_moe","hidden_size":64,"moe_intermediate_size":32,"n_routed_experts":8,
    "num_experts_per_tok":2,"num_hidden_layers":2})", "new");
  CHECK_FALSE(fresh.routing_unsupported.empty());
  auto kimi = parse_model_config(R"({"model_type":"kimi_k2","auto_map":{"AutoConfig":"configuration_deepseek.DeepseekV3Config"},
    "hidden_size":64,"moe_intermediate_size":32,"n_routed_experts":8,"num_experts_per_tok":2,"num_hidden_layers":2,
    "scoring_func":"sigmoid","topk_method":"noaux_tc","n_group":1,"topk_group":1,"norm_topk_prob":true,"routed_scaling_factor":2.827})",
                                 "kimi");
  CHECK(kimi.routing_unsupported.empty());
  CHECK(kimi.scoring_func == "sigmoid");
  CHECK(parse_model_config(R"({"hidden_size":64,"moe_intermediate_size":32,"num_experts":8,"num_experts_per_tok":2,
    "num_hidden_layers":2})", "no type").routing_unsupported.empty());  // hand-written: its fields are all there is
  // Types added after checking against transformers v5: DeepSeek-V3's router under other names, and
  // Qwen3.5-MoE's top-k always renormalised.
  for (const char* type : {"glm_moe_dsa", "solar_open", "mimo_v2_flash"}) {
    INFO(type);
    auto c = parse_model_config(std::string(R"({"model_type":")") + type + R"(","hidden_size":64,"moe_intermediate_size":32,
      "n_routed_experts":8,"num_experts_per_tok":2,"num_hidden_layers":2})", "sigmoid");
    CHECK(c.scoring_func == "sigmoid");
    CHECK(c.topk_method == "noaux_tc");
    CHECK(c.routing_unsupported.empty());
  }
  auto q35 = parse_model_config(R"({"model_type":"qwen3_5_moe","text_config":{"model_type":"qwen3_5_moe_text","hidden_size":64,
    "moe_intermediate_size":32,"num_experts":8,"num_experts_per_tok":2,"num_hidden_layers":2,"norm_topk_prob":false}})", "q35");
  CHECK(q35.norm_topk_prob);
  CHECK(q35.routing_unsupported.empty());
  // Sigmoid routers under their own field names: HY-V3's and AFMoE's scale, always renormalised;
  // Kimi-Linear's count, top-k, renormalisation and groups.
  auto hy3 = parse_model_config(R"({"model_type":"hy_v3","hidden_size":64,"moe_intermediate_size":32,"num_experts":8,
    "num_experts_per_tok":2,"num_hidden_layers":3,"router_scaling_factor":2.5,"mlp_layer_types":["dense","sparse","sparse"]})", "hy3");
  CHECK(hy3.scoring_func == "sigmoid");
  CHECK(hy3.routed_scaling_factor == 2.5);
  CHECK(hy3.norm_topk_prob);
  CHECK(hy3.moe_layers == std::vector<int>{1, 2});
  auto af = parse_model_config(R"({"model_type":"afmoe","hidden_size":64,"moe_intermediate_size":32,"num_experts":8,
    "num_experts_per_tok":2,"num_hidden_layers":4,"num_dense_layers":2,"route_scale":1.5,"norm_topk_prob":false})", "afmoe");
  CHECK(af.routed_scaling_factor == 1.5);
  CHECK(af.norm_topk_prob);  // AfmoeTokenChoiceRouter always renormalises
  CHECK(af.moe_layers == std::vector<int>{2, 3});
  CHECK(af.routing_unsupported.empty());
  auto kl = parse_model_config(R"({"model_type":"kimi_linear","hidden_size":64,"moe_intermediate_size":32,"num_experts":8,
    "num_experts_per_token":2,"num_hidden_layers":2,"moe_renormalize":false,"num_expert_group":2,"topk_group":1,
    "routed_scaling_factor":2.0,"mlp_layer_types":["dense","sparse"]})", "kimi linear");
  CHECK(kl.shape.top_k == 2);
  CHECK_FALSE(kl.norm_topk_prob);
  CHECK(kl.n_group == 2);
  CHECK(kl.unchosen_groups_neg_inf);
  CHECK(kl.moe_layers == std::vector<int>{1});
  CHECK_FALSE(parse_model_config(R"({"model_type":"deepseek_v3","hidden_size":64,"moe_intermediate_size":32,"n_routed_experts":16,
    "num_experts_per_tok":2,"num_hidden_layers":2})", "v3").unchosen_groups_neg_inf);
  // DeepSeek-V4: a clamped SwiGLU, a sqrt(softplus) router, the first num_hash_layers hash-routed by default.
  auto v4 = parse_model_config(R"({"model_type":"deepseek_v4","hidden_size":64,"moe_intermediate_size":32,"n_routed_experts":8,
    "num_experts_per_tok":2,"num_hidden_layers":5,"swiglu_limit":10.0,"scoring_func":"sqrtsoftplus"})", "v4");
  CHECK(v4.shape.swiglu_limit == 10.0f);
  CHECK(v4.scoring_func == "sqrtsoftplus");
  CHECK(v4.topk_method == "noaux_tc");
  CHECK(v4.norm_topk_prob);
  CHECK(v4.routed_scaling_factor == 1.5);
  CHECK(v4.moe_layers == std::vector<int>{0, 1, 2, 3, 4});
  CHECK(v4.hash_routed_layers == std::vector<int>{0, 1, 2});
  CHECK(v4.routing_unsupported.empty());
  auto v4_listed = parse_model_config(R"({"model_type":"deepseek_v4","hidden_size":64,"moe_intermediate_size":32,"n_routed_experts":8,
    "num_experts_per_tok":2,"num_hidden_layers":3,"mlp_layer_types":["hash_moe","moe","moe"]})", "v4");
  CHECK(v4_listed.moe_layers == std::vector<int>{0, 1, 2});
  CHECK(v4_listed.hash_routed_layers == std::vector<int>{0});
  CHECK(v4_listed.shape.swiglu_limit == 0.0f);  // absent: no clamp
  CHECK(error_of([] {
          parse_model_config(R"({"model_type":"deepseek_v4","hidden_size":64,"moe_intermediate_size":32,"n_routed_experts":8,
            "num_experts_per_tok":2,"num_hidden_layers":2,"mlp_layer_types":["moe","dense"]})", "v4");
        }).find("v4: mlp_layer_types[1] is \"dense\", not \"moe\" or \"hash_moe\"") == 0);
  for (const char* bad : {"-1.0", "0", "\"10\"", "1e40"})
    CHECK(error_of([bad] {
            parse_model_config(std::string(R"({"model_type":"deepseek_v4","hidden_size":64,"moe_intermediate_size":32,"n_routed_experts":8,
              "num_experts_per_tok":2,"num_hidden_layers":2,"swiglu_limit":)") + bad + "}", "v4");
          }).find("v4: swiglu_limit is ") == 0);
  // Optional integer fields: an integral float is that integer; one out of int's range (the fuzzer's
  // 1.6e40, undefined behaviour in the JSON library's conversion), a fraction or a non-number is
  // as absent.
  for (const auto& [freq, layers] : std::vector<std::pair<std::string, std::vector<int>>>{
           {"2.0", {2}}, {"1.5555555555555555e40", {1, 2, 3}}, {"-1e300", {1, 2, 3}}, {"1.5", {1, 2, 3}}, {"\"2\"", {1, 2, 3}},
           {"4294967298", {1, 2, 3}}}) {
    INFO("moe_layer_freq " << freq);
    CHECK(parse_model_config(R"({"model_type":"deepseek_v2","hidden_size":64,"moe_intermediate_size":32,"n_routed_experts":8,
      "num_experts_per_tok":2,"num_hidden_layers":4,"first_k_dense_replace":1,"moe_layer_freq":)" + freq + "}", "f").moe_layers == layers);
  }
  // A swiglu_limit of another type: its clamp may be another formula.
  CHECK(error_of([] {
          parse_model_config(R"({"model_type":"step9","hidden_size":64,"moe_intermediate_size":32,"n_routed_experts":8,
            "num_experts_per_tok":2,"num_hidden_layers":2,"swiglu_limit":7.0})", "s9");
        }).find("s9: model_type 'step9': its experts clamp gate and up at swiglu_limit 7.0") == 0);
  // Experts that compute something else are refused by name.
  CHECK(error_of([] {
          parse_model_config(R"({"model_type":"minimax_m3_vl_text","hidden_size":64,"intermediate_size":32,"num_local_experts":8,
            "num_experts_per_tok":2,"num_hidden_layers":2})", "m3");
        }).find("m3: model_type 'minimax_m3_vl_text': its experts' output is not") == 0);
  err = error_of([] {
    parse_model_config(R"({"model_type":"qwen3_moe","hidden_size":64,"moe_intermediate_size":32,"num_experts":8,"num_experts_per_tok":2,
      "num_hidden_layers":2,"hidden_act":"gelu"})", "g.json");
  });
  CHECK(err.find("g.json: hidden_act is 'gelu'") == 0);
  err = error_of([] {
    parse_model_config(R"({"model_type":"jetmoe","hidden_size":64,"intermediate_size":32,"num_local_experts":8,"num_experts_per_tok":2,
      "num_hidden_layers":2})", "j.json");
  });
  CHECK(err.find("j.json: model_type 'jetmoe'") == 0);
  CHECK(error_of([] { parse_model_config("{", "cfg.json"); }).find("cfg.json: not valid JSON") == 0);
  CHECK(error_of([] { parse_model_config(R"({"model_type":"llama","hidden_size":4,"num_hidden_layers":2,"num_experts_per_tok":1})", "l"); })
            .find("no routed experts") != std::string::npos);
  CHECK(error_of([] { parse_model_config(R"({"model_type":"mixtral","hidden_size":4,"num_hidden_layers":2})", "m"); })
            .find("num_experts_per_tok") != std::string::npos);
}

TEST_CASE("checkpoints load under every naming and reject broken experts", "[checkpoint]") {
  auto ds = Checkpoint::open(make_model("ds", "mlp", {"gate_proj", "up_proj", "down_proj"}));
  auto mx = Checkpoint::open(make_model("mx", "block_sparse_moe", {"w1", "w3", "w2"}));
  auto om = Checkpoint::open(make_model("om", "mlp.original_moe", {"gate_proj", "up_proj", "down_proj"}));
  auto a = ds.load_layer_experts(1), b = mx.load_layer_experts(1), c = om.load_layer_experts(1);
  CHECK(a.gate == b.gate);
  CHECK(a.down == c.down);
  CHECK(a.up == b.up);
  CHECK(ds.load_router(1).weight.size() == 3 * 24);
  CHECK(error_of([&] { ds.load_layer_experts(0); }).find("layer 0 is not a MoE layer (MoE layers: 1, 2)") != std::string::npos);
  CHECK(error_of([&] { ds.load_router(2); }).find("layer 2 has no router") != std::string::npos);

  auto missing = Checkpoint::open(make_model("missing", "mlp", {"gate_proj", "up_proj", "down_proj"}, nullptr, true));
  CHECK(error_of([&] { missing.load_layer_experts(1); }).find("layer 1 expert 2 up weight is missing") != std::string::npos);

  std::vector<bf16> nan(static_cast<std::size_t>(24) * 17, float_to_bf16(0.1f));
  nan[40] = 0x7fc0;
  auto poisoned = Checkpoint::open(make_model("nan", "mlp", {"gate_proj", "up_proj", "down_proj"}, &nan));
  std::string err = error_of([&] { poisoned.load_layer_experts(1); });
  CHECK(err.find("layer 1 expert 1 down") != std::string::npos);
  CHECK(err.find("element 40 is NaN") != std::string::npos);
  CHECK(poisoned.load_layer_experts(2).shape.num_experts == 3);  // the other layer is untouched

  // A bias on an expert projection would be read past unseen: refused, naming the file and tensor.
  // The router's correction bias beside its weight (DeepSeek-V3) or on the MoE block (MiniMax-M2).
  for (const std::string where : {"gate.e_score_correction_bias", "e_score_correction_bias", "moe_statics.e_score_correction_bias",
                                  "expert_bias"}) {
    auto c = Checkpoint::open(make_model("corr_" + where, "block_sparse_moe", {"w1", "w3", "w2"}, nullptr, false, false, where));
    CHECK(c.router_tensor_names(1) == std::vector<std::string>{"model.layers.1.block_sparse_moe.gate.weight",
                                                               "model.layers.1.block_sparse_moe." + where});
    CHECK(c.load_router(1).correction_bias == std::vector<float>(kShape.num_experts, 0.25f));
  }
  CHECK(mx.router_tensor_names(1) == std::vector<std::string>{"model.layers.1.block_sparse_moe.gate.weight"});
  // Hunyuan's and GraniteMoE's router names
  // HY-V3 and AFMoE: "mlp.router.gate.weight" with the block's "mlp.expert_bias" two modules up
  {
    auto c = Checkpoint::open(make_model("router_gate", "mlp", {"gate_proj", "up_proj", "down_proj"}, nullptr, false, false, "expert_bias",
                                         "router.gate.weight"));
    CHECK(c.router_tensor_names(1) == std::vector<std::string>{"model.layers.1.mlp.router.gate.weight", "model.layers.1.mlp.expert_bias"});
  }
  for (const std::string router : {"gate.wg.weight", "router.layer.weight"}) {
    auto c = Checkpoint::open(make_model("router_" + router, "mlp", {"gate_proj", "up_proj", "down_proj"}, nullptr, false, false, "", router));
    CHECK(c.router_tensor_names(1) == std::vector<std::string>{"model.layers.1.mlp." + router});
    CHECK(c.load_router(1).weight.size() == 3 * 24);
  }
  // DeepSeek-V4 as transformers saves it, in DeepSeek's names: ffn.experts.E.w1 / w3 / w2, the
  // correction bias as the router's own "ffn.gate.bias"; the swiglu_limit of its config.json is
  // the experts' (read with them, and by a layer built from the checkpoint).
  {
    const std::string d = make_model("v4", "ffn", {"w1", "w3", "w2"}, nullptr, false, false, "gate.bias");
    write_text(d + "/config.json", R"({"model_type": "deepseek_v4", "hidden_size": 24, "moe_intermediate_size": 17,
      "n_routed_experts": 3, "num_experts_per_tok": 2, "num_hidden_layers": 3, "swiglu_limit": 0.05,
      "mlp_layer_types": ["moe", "hash_moe", "moe"]})");
    auto c = Checkpoint::open(d);
    CHECK(c.router_tensor_names(1) == std::vector<std::string>{"model.layers.1.ffn.gate.weight", "model.layers.1.ffn.gate.bias"});
    auto experts = c.load_layer_experts(1);
    CHECK(experts.shape.swiglu_limit == 0.05f);
    CHECK(experts.gate == ds.load_layer_experts(1).gate);
    Runtime rt(RuntimeOptions{"portable", 1});
    CheckpointLayerOptions options;
    options.max_tokens = 4;
    MoeLayer layer = MoeLayer::from_checkpoint(rt, d, 1, options);
    CHECK(layer.config().swiglu_limit == Approx(0.05));
    const std::vector<float> xf = test_values(2 * 24, 3);
    std::vector<bf16> x;
    for (float v : xf) x.push_back(float_to_bf16(v));
    const std::vector<std::int64_t> ids = {0, 2, 1, -1};
    const std::vector<float> wts = {0.6f, 0.4f, 1.0f, 0.5f};
    std::vector<float> got(2 * 24), want(got.size()), unclamped(got.size());
    layer.forward(2, 2, x.data(), ids.data(), wts.data(), got.data());
    std::vector<float> xr(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) xr[i] = bf16_to_float(x[i]);
    MoeBatch<float> batch{2, 2, xr.data(), ids.data(), wts.data()};
    reference_forward(experts.view(), LayerLora{}, batch, want.data());
    ExpertWeightsView plain = experts.view();
    plain.shape.swiglu_limit = 0;
    reference_forward(plain, LayerLora{}, batch, unclamped.data());
    CHECK(test::rel_error(got, want) <= 1e-2);
    CHECK(test::rel_error(unclamped, want) > 0.1);  // the limit is met by these values
  }
  auto biased = Checkpoint::open(make_model("bias", "block_sparse_moe", {"w1", "w3", "w2"}, nullptr, false, true));
  err = error_of([&] { biased.load_layer_experts(1); });
  CHECK(err.find("model.safetensors: layer 1 expert 2 down has a bias") != std::string::npos);
  CHECK(err.find("'model.layers.1.block_sparse_moe.experts.2.w2.bias'") != std::string::npos);
  CHECK(biased.load_layer_experts(2).shape.num_experts == 3);  // layer 2 has none

  // A GPTQ checkpoint's experts are qweight and scales: the missing weight's error says why.
  std::string gptq = fresh_dir("gptq");
  std::string cfg = deepseek_config();
  cfg.insert(cfg.rfind('}'), R"(, "quantization_config": {"quant_method": "gptq", "bits": 4})");
  write_text(gptq + "/config.json", cfg);
  io::SafetensorsWriter q;
  q.add_f32("model.layers.1.mlp.experts.0.gate_proj.qweight", {2, 2}, std::vector<float>(4, 0.0f));
  q.write(gptq + "/model.safetensors");
  auto quantized = Checkpoint::open(gptq);
  err = error_of([&] { quantized.load_layer_experts(1); });
  CHECK(err.find("layer 1 expert 0 gate weight is missing") != std::string::npos);
  CHECK(err.find("quant_method 'gptq'") != std::string::npos);
  CHECK(error_of([&] { missing.load_layer_experts(1); }).find("quant_method") == std::string::npos);
}

TEST_CASE("PEFT adapters: any prefix, partial coverage, patterns, errors", "[peft]") {
  auto model = parse_model_config(deepseek_config(), "cfg");
  std::string cfg = R"({"peft_type":"LORA","r":4,"lora_alpha":8,"use_rslora":false,"target_modules":["gate_proj","up_proj","down_proj"]})";
  auto ad = PeftAdapter::open(make_adapter("ok", cfg), model);
  CHECK(ad.expert_keys() == 12);
  CHECK(ad.ignored_keys() == 2);
  auto l = load_peft_layer(ad, model.shape, 1);
  for (Projection p : kProjections) {
    CHECK(l.lora[p].rank == 4);
    CHECK(l.lora[p].present == std::vector<std::uint8_t>{1, 0, 1});
    CHECK(l.lora[p].scale == std::vector<float>{2.0f, 0.0f, 2.0f});
    for (int i = 0; i < l.lora[p].rank * l.lora[p].in; ++i) REQUIRE(l.lora[p].a_of(1)[i] == 0.0f);  // uncovered: zeros
  }
  CHECK(l.key_a(Projection::gate, 2) == "base_model.model.language_model.layers.1.mlp.experts.2.gate_proj.lora_A.weight");
  CHECK(load_peft_layer(ad, model.shape, 2).lora.empty());

  auto rs = PeftAdapter::open(make_adapter("rslora", R"({"r":4,"lora_alpha":8,"use_rslora":true})"), model);
  CHECK(load_peft_layer(rs, model.shape, 1).lora[Projection::up].scale[0] == Approx(4.0f));
  auto pat = PeftAdapter::open(
      make_adapter("pattern", R"({"r":8,"lora_alpha":8,"rank_pattern":{"experts.0.gate_proj":4,"experts\\.[0-9]+\\.(up|down)_proj":4,
        "experts.2.gate_proj":4},"alpha_pattern":{"layers.1.mlp.experts.2.down_proj":16}})"),
      model);
  auto lp = load_peft_layer(pat, model.shape, 1);
  CHECK(lp.lora[Projection::down].scale[2] == Approx(4.0f));
  CHECK(lp.lora[Projection::down].scale[0] == Approx(2.0f));

  CHECK(error_of([&] { PeftAdapter::open(make_adapter("rankmismatch", cfg, 5), model); }).find("rank differs between A") != std::string::npos);
  std::string dim = error_of([&] { PeftAdapter::open(make_adapter("dim", cfg, -1, 23), model); });
  CHECK(dim.find("layer 1 expert 0 gate") != std::string::npos);
  CHECK(dim.find("do not fit the model") != std::string::npos);
  CHECK(dim.find("adapter_model.safetensors") != std::string::npos);
  CHECK(error_of([&] { PeftAdapter::open(make_adapter("dora", R"({"r":4,"lora_alpha":8,"use_dora":true})"), model); }).find("DoRA") !=
        std::string::npos);
  CHECK(error_of([&] { PeftAdapter::open(test::temp_dir() + "/nowhere", model); }).find("adapter_config.json") != std::string::npos);
  // PEFT's lora_bias puts a bias on lora_B, which the expert LoRA would otherwise read past.
  std::string lb = error_of([&] { PeftAdapter::open(make_adapter("lora_bias", R"({"r":4,"lora_alpha":8,"lora_bias":true})", -1, -1, true), model); });
  CHECK(lb.find("adapter_model.safetensors: layer 1 expert 0 ") != std::string::npos);
  CHECK(lb.find(" LoRA B (") != std::string::npos);
  CHECK(lb.find("lora_B.bias") != std::string::npos);
  CHECK(lb.find("lora_bias") != std::string::npos);

  // An adapter with attention keys only loads, with a warning.
  std::string d = fresh_dir("attn_only");
  write_text(d + "/adapter_config.json", cfg);
  io::SafetensorsWriter f;
  f.add_f32("base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight", {4, 24}, std::vector<float>(96, 0.1f));
  f.write(d + "/adapter_model.safetensors");
  auto attn = PeftAdapter::open(d, model);
  CHECK(attn.expert_keys() == 0);
  REQUIRE(attn.warnings().size() == 1);
  CHECK(attn.warnings()[0].find("no routed-expert LoRA keys") != std::string::npos);
  CHECK(load_peft_layer(attn, model.shape, 1).lora.empty());
}

TEST_CASE("converted LoRA files keep per-expert rank, scale and coverage", "[convert]") {
  auto model = parse_model_config(deepseek_config(), "cfg");
  auto ad = PeftAdapter::open(make_adapter("conv", R"({"r":4,"lora_alpha":8})"), model);
  std::string out = test::temp_dir() + "/conv.safetensors";
  convert_peft_to_lora_file(ad, model, out);
  auto f = io::SafetensorsFile::open(out);
  CHECK(f.metadata().at("format") == "tilemoe-lora");
  CHECK(f.metadata().at("lora_rank") == "4");
  CHECK(f.get("layer_1.gate_lora_a").shape == std::vector<std::int64_t>{3, 4, 24});
  CHECK(f.get("layer_1.down_lora_b").shape == std::vector<std::int64_t>{3, 24, 4});
  auto a = load_converted_layer(out, model, 1), b = load_peft_layer(ad, model.shape, 1);
  for (Projection p : kProjections) {
    CHECK(a.lora[p].a == b.lora[p].a);
    CHECK(a.lora[p].b == b.lora[p].b);
    CHECK(a.lora[p].present == b.lora[p].present);
  }
  auto other = parse_model_config(R"({"model_type":"deepseek_v2","hidden_size":32,"moe_intermediate_size":17,"n_routed_experts":3,
      "num_experts_per_tok":2,"num_hidden_layers":3,"first_k_dense_replace":1})", "other");
  CHECK(error_of([&] { load_converted_layer(out, other, 1); }).find("made for hidden 24") != std::string::npos);
  CHECK(error_of([&] { load_converted_layer(test::data_dir() + "/deepseek_tiny/reference.safetensors", model, 1); })
            .find("not a tilemoe LoRA file") != std::string::npos);
}

TEST_CASE("adapters are held in bf16 exactly when every factor tensor of the file was BF16", "[peft][held]") {
  // gate covers experts 0 and 2, down expert 1, up nothing; values that bf16 holds exactly.
  LoadedLora l;
  l.lora[Projection::gate].allocate(3, 4, 8, 6);
  l.lora[Projection::down].allocate(3, 2, 6, 8);
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  for (Projection p : {Projection::gate, Projection::down}) {
    auto& proj = l.lora[p];
    for (float& v : proj.a) v = bf16_to_float(float_to_bf16(normal(rng)));
    for (float& v : proj.b) v = bf16_to_float(float_to_bf16(normal(rng)));
  }
  for (int e : {0, 2}) l.lora[Projection::gate].present[e] = 1, l.lora[Projection::gate].scale[e] = 0.5f;
  l.lora[Projection::down].present[1] = 1;
  l.lora[Projection::down].scale[1] = 2.0f;
  using io::Dtype;
  // Experts an adapter does not cover keep the loader's placeholder dtype, which does not count.
  l.dtype_a[0] = l.dtype_b[0] = {Dtype::BF16, Dtype::F32, Dtype::BF16};
  l.dtype_a[2] = l.dtype_b[2] = {Dtype::F32, Dtype::BF16, Dtype::F32};

  SECTION("all BF16: bf16, the same values, half the bytes") {
    REQUIRE(stored_as_bf16(l));
    HeldAdapter held(l);
    REQUIRE(held.dtype() == LoraDType::bf16);
    std::size_t f32_bytes = 0;
    for (Projection p : kProjections) {
      const auto& src = l.lora[p];
      const LoraProjectionView& v = held.view()[p];
      REQUIRE(v.rank == src.rank);
      f32_bytes += (src.a.size() + src.b.size()) * sizeof(float);
      if (src.rank == 0) continue;
      CHECK(v.dtype == LoraDType::bf16);
      const auto* a = static_cast<const std::uint16_t*>(v.a);
      const auto* b = static_cast<const std::uint16_t*>(v.b);
      for (std::size_t i = 0; i < src.a.size(); ++i) REQUIRE(bf16_to_float(a[i]) == src.a[i]);
      for (std::size_t i = 0; i < src.b.size(); ++i) REQUIRE(bf16_to_float(b[i]) == src.b[i]);
      for (int e = 0; e < 3; ++e) {
        CHECK(v.present[e] == src.present[e]);
        CHECK(v.scale[e] == src.scale[e]);
      }
    }
    CHECK(held.factor_bytes() * 2 == f32_bytes);
  }
  SECTION("one covered tensor of another type, or a type not known: f32, as loaded") {
    SECTION("F16") { l.dtype_b[0][2] = Dtype::F16; }
    SECTION("F32") { l.dtype_a[2][1] = Dtype::F32; }
    SECTION("not known") { l.dtype_a[2].clear(); }
    REQUIRE_FALSE(stored_as_bf16(l));
    HeldAdapter held(l);
    CHECK(held.dtype() == LoraDType::f32);
    CHECK(static_cast<const float*>(held.view()[Projection::gate].a)[5] == l.lora[Projection::gate].a[5]);
  }
  SECTION("AdapterStorage::bf16 rounds other values to nearest even; f32 keeps a BF16 file in f32") {
    LoadedLora wide = l;
    for (float& v : wide.lora[Projection::gate].a) v += 1e-3f * normal(rng);
    l.dtype_a[0][0] = Dtype::F32;  // not all BF16 any more
    wide.dtype_a[0][0] = Dtype::F32;
    HeldAdapter rounded(wide, AdapterStorage::bf16);
    REQUIRE(rounded.dtype() == LoraDType::bf16);
    const auto* a = static_cast<const std::uint16_t*>(rounded.view()[Projection::gate].a);
    int moved = 0;
    for (std::size_t i = 0; i < wide.lora[Projection::gate].a.size(); ++i) {
      const float v = wide.lora[Projection::gate].a[i];
      REQUIRE(a[i] == float_to_bf16(v));
      moved += bf16_to_float(a[i]) != v;
    }
    CHECK(moved > 0);  // the test's values did need rounding
    CHECK(HeldAdapter(wide, AdapterStorage::as_stored).dtype() == LoraDType::f32);
    l.dtype_a[0][0] = Dtype::BF16;
    REQUIRE(stored_as_bf16(l));
    HeldAdapter widened(l, AdapterStorage::f32);
    CHECK(widened.dtype() == LoraDType::f32);
    CHECK(static_cast<const float*>(widened.view()[Projection::down].b)[3] == l.lora[Projection::down].b[3]);
  }
  SECTION("a value beyond bf16's range is refused, the projection and expert named") {
    l.lora[Projection::down].b[8 * 2 + 5] = 3.4e38f;  // expert 1 (8 x 2 per expert), finite in f32
    try {
      HeldAdapter held(l, AdapterStorage::bf16);
      FAIL("no error");
    } catch (const Error& e) {
      CHECK(e.kind() == ErrorKind::invalid_argument);
      const std::string what = e.what();
      CHECK(what.find("B of down, expert 1") != std::string::npos);
      CHECK(what.find("f32") != std::string::npos);
    }
    CHECK(HeldAdapter(l, AdapterStorage::f32).dtype() == LoraDType::f32);
  }
  SECTION("no LoRA at all: nothing to hold in bf16") {
    LoadedLora none;
    CHECK_FALSE(stored_as_bf16(none));
    CHECK(HeldAdapter(none).view().empty());
  }
}
