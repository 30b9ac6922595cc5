#include "src/model/model_config.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <type_traits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tilemoe/error.hpp"

namespace tilemoe {
namespace {

using nlohmann::json;

int require_int(const json& j, const char* key, const std::string& src) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number_integer())
    fail(ErrorKind::bad_file, src + ": missing or non-integer field '" + key + "'");
  auto v = it->get<long long>();
  if (v < 0 || v > (1 << 30)) fail(ErrorKind::bad_file, src + ": field '" + key + "' is out of range");
  return static_cast<int>(v);
}

// An int, or a list of one int per layer (Hunyuan writes moe_topk and moe_intermediate_size so)
// whose entries must all be equal: tilemoe gives every MoE layer of a model one shape.
int require_uniform_int(const json& j, const char* key, const std::string& src) {
  auto it = j.find(key);
  if (it != j.end() && it->is_array() && !it->empty()) {
    for (const auto& v : *it)
      if (!v.is_number_integer() || v != it->front())
        fail(ErrorKind::unsupported, src + ": field '" + key + "' is " + it->dump() +
                                         ": a value that differs by layer (or is not an integer); tilemoe gives every MoE layer one shape");
    json one = {{key, it->front()}};
    return require_int(one, key, src);
  }
  return require_int(j, key, src);
}

// An integer of type I from a JSON number that holds one exactly (1 and 1.0, not 1.5 or 1e40):
// nlohmann's own conversion of a float outside I's range is undefined behaviour (found by the
// loaders' fuzzer), and a large integer would wrap.
template <typename I>
bool exact_integer(const json& v, I& out) {
  constexpr long double lo = static_cast<long double>(std::numeric_limits<I>::min());
  constexpr long double hi = static_cast<long double>(std::numeric_limits<I>::max());
  long double x;
  if (v.is_number_unsigned()) x = static_cast<long double>(v.get<unsigned long long>());
  else if (v.is_number_integer()) x = static_cast<long double>(v.get<long long>());
  else if (v.is_number_float()) x = static_cast<long double>(v.get<double>());
  else return false;
  if (!(x >= lo && x <= hi) || x != std::trunc(x)) return false;
  out = static_cast<I>(x);
  return true;
}

// config.json's optional fields: the fallback when absent, null or not of the type asked for.
template <typename T>
T value_or(const json& j, const char* key, T fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if constexpr (std::is_same_v<T, int>) {
    int v;
    return exact_integer(*it, v) ? v : fallback;
  } else if constexpr (std::is_same_v<T, std::vector<int>>) {
    if (!it->is_array()) return fallback;
    std::vector<int> out;
    for (const auto& e : *it) {
      int v;
      if (!exact_integer(e, v)) return fallback;
      out.push_back(v);
    }
    return out;
  } else {
    try {
      return it->get<T>();
    } catch (const json::exception&) {
      return fallback;
    }
  }
}

// DeepSeek-V2/V3: dense for the first first_k_dense_replace layers, then MoE every moe_layer_freq.
std::vector<int> deepseek_moe_layers(const json& j, int layers) {
  int first_dense = value_or<int>(j, "first_k_dense_replace", 0);
  int freq = std::max(1, value_or<int>(j, "moe_layer_freq", 1));
  std::vector<int> out;
  for (int l = first_dense; l < layers; ++l)
    if (l % freq == 0) out.push_back(l);
  return out;
}

// Qwen2/Qwen3-MoE: MoE where (l + 1) % decoder_sparse_step == 0 and l is not in mlp_only_layers.
std::vector<int> qwen_moe_layers(const json& j, int layers) {
  int step = std::max(1, value_or<int>(j, "decoder_sparse_step", 1));
  auto mlp_only = value_or<std::vector<int>>(j, "mlp_only_layers", {});
  std::vector<int> out;
  for (int l = 0; l < layers; ++l)
    if ((l + 1) % step == 0 && std::find(mlp_only.begin(), mlp_only.end(), l) == mlp_only.end()) out.push_back(l);
  return out;
}

// Qwen2-MoE's and Qwen3-MoE's experts: their size apart from the dense MLP's intermediate_size, their
// count under `experts_key`, MoE layers by decoder_sparse_step and mlp_only_layers.
void read_qwen_moe(const json& j, const char* experts_key, ModelConfig& c, const std::string& src) {
  c.shape.intermediate = require_int(j, "moe_intermediate_size", src);
  c.shape.num_experts = require_int(j, experts_key, src);
  c.moe_layers = qwen_moe_layers(j, c.num_layers);
  c.norm_topk_prob = value_or<bool>(j, "norm_topk_prob", false);  // both configs' default (Qwen3-MoE checkpoints set it true)
}

// Types whose transformers router is DeepSeek-V3's whatever config.json says (DeepseekV3TopkRouter
// and its copies: sigmoid scores, noaux_tc choice by score + e_score_correction_bias, weights from
// the score alone, renormalised if norm_topk_prob, times routed_scaling_factor), with each config
// class's defaults for the fields config.json may leave out.
struct SigmoidRouterDefaults {
  const char* model_type;
  int n_group, topk_group;
  bool norm_topk_prob;
  double routed_scaling_factor;
  bool reads_config = true;  // false: the router class fixes these, whatever config.json says
  // The config fields read, where a type names them otherwise; a null norm_key: always renormalised.
  const char* scale_key = "routed_scaling_factor";
  const char* norm_key = "norm_topk_prob";
  const char* group_key = "n_group";
  bool unchosen_groups_neg_inf = false;  // masked_fill(-inf), where DeepSeek-V3 fills 0.0
  const char* scoring = "sigmoid";
};
constexpr SigmoidRouterDefaults kSigmoidRouters[] = {
    {"deepseek_v3", 8, 4, true, 2.5},   {"deepseek_v32", 8, 4, true, 2.5}, {"glm4_moe", 1, 1, true, 1.0},
    {"glm4v_moe_text", 1, 1, true, 1.0}, {"glm4_moe_lite", 1, 1, true, 1.8}, {"dots1", 1, 1, false, 1.0},
    {"exaone_moe", 1, 1, true, 2.5},     {"glm_moe_dsa", 1, 1, true, 1.0},  {"solar_open", 1, 1, true, 1.0},
    {"mimo_v2_flash", 1, 1, true, 1.0},
    // MiniMaxM2TopKRouter: no groups, always renormalised, never scaled; its correction bias sits on
    // the MoE block (Checkpoint::router_tensor_names finds it there).
    {"minimax_m2", 1, 1, true, 1.0, /*reads_config=*/false},
    // HYV3TopKRouter and AfmoeTokenChoiceRouter: no groups, always renormalised, scaled by a field of
    // their own; the bias is the MoE block's expert_bias.
    {"hy_v3", 1, 1, true, 2.826, true, "router_scaling_factor", nullptr},
    {"afmoe", 1, 1, true, 1.0, true, "route_scale", nullptr},
    // KimiLinearTopkRouter: Kimi's names for the fields, groups outside the chosen ones masked to -inf.
    {"kimi_linear", 1, 1, true, 2.446, true, "routed_scaling_factor", "moe_renormalize", "num_expert_group", true},
    // DeepseekV4TopKRouter: sqrt(softplus(logit)) scores, no groups, always renormalised; the
    // correction bias is saved as the router's own bias ("...ffn.gate.bias").
    {"deepseek_v4", 1, 1, true, 1.5, true, "routed_scaling_factor", nullptr, "n_group", false, "sqrtsoftplus"},
};

// Types whose routers tilemoe computes as transformers v5 does (checked by
// tests/python/test_module_model_types_v5.py), beside the sigmoid ones above. Another named type
// may route otherwise than its fields suggest (a correction bias, a per-slot softmax, a hash), so
// routing by its router is refused (its experts still run with ids given to them) unless it is
// remote code whose config.json states its router, as DeepSeek-MoE's and Kimi-K2's do.
constexpr const char* kRoutedTypes[] = {"deepseek_v2", "qwen2_moe", "qwen3_moe", "qwen3_next", "mixtral", "minimax", "olmoe", "flex_olmo",
                                        "ernie4_5_moe", "hunyuan_v1_moe", "granitemoe", "granitemoeshared", "qwen3_5_moe_text",
                                        "mellum", "qwen4_exp_text", "gpt_oss"};

const SigmoidRouterDefaults* sigmoid_router_of(const std::string& model_type) {
  for (const auto& d : kSigmoidRouters)
    if (model_type == d.model_type) return &d;
  return nullptr;
}

bool router_checked(const std::string& model_type) {
  for (const char* t : kRoutedTypes)
    if (model_type == t) return true;
  return sigmoid_router_of(model_type) != nullptr;
}

std::string routed_types_list() {
  std::string out;
  for (const char* t : kRoutedTypes) out += std::string(out.empty() ? "" : ", ") + t;
  for (const auto& d : kSigmoidRouters) out += std::string(", ") + d.model_type;
  return out;
}

// ERNIE-4.5-MoE: MoE from moe_layer_start_index to moe_layer_end_index (-1: the last layer), every
// moe_layer_interval-th ((l + 1) % interval == 0), as Ernie4_5_MoeDecoderLayer decides.
std::vector<int> ernie_moe_layers(const json& j, int layers) {
  const int start = value_or<int>(j, "moe_layer_start_index", 1);
  int end = value_or<int>(j, "moe_layer_end_index", -1);
  if (end == -1) end = layers - 1;
  const int interval = std::max(1, value_or<int>(j, "moe_layer_interval", 1));
  std::vector<int> out;
  for (int l = 0; l < layers; ++l)
    if ((l + 1) % interval == 0 && l >= start && l <= end) out.push_back(l);
  return out;
}

// The router as transformers runs each type, whatever config.json adds: the sigmoid types above;
// DeepseekV2Moe always uses softmax and never renormalises (it ignores norm_topk_prob). Other
// types with n_routed_experts (DeepSeek-MoE, remote-code models such as Kimi-K2) take the fields
// as written; their routing is refused unless config.json states it (kRoutedTypes above).
void read_deepseek_router(const json& j, ModelConfig& c) {
  if (const auto* d = sigmoid_router_of(c.model_type)) {
    auto field = [&](const char* key, auto fallback) { return d->reads_config ? value_or<decltype(fallback)>(j, key, fallback) : fallback; };
    c.scoring_func = d->scoring;
    c.topk_method = "noaux_tc";
    c.norm_topk_prob = d->norm_key ? field(d->norm_key, d->norm_topk_prob) : d->norm_topk_prob;
    c.routed_scaling_factor = field(d->scale_key, d->routed_scaling_factor);
    c.n_group = field(d->group_key, d->n_group);
    c.topk_group = field("topk_group", d->topk_group);
    c.unchosen_groups_neg_inf = d->unchosen_groups_neg_inf;
    return;
  }
  const bool v2 = c.model_type == "deepseek_v2";
  c.scoring_func = v2 ? "softmax" : value_or<std::string>(j, "scoring_func", "softmax");
  c.topk_method = value_or<std::string>(j, "topk_method", "greedy");
  c.norm_topk_prob = v2 ? false : value_or<bool>(j, "norm_topk_prob", false);
  c.routed_scaling_factor = value_or<double>(j, "routed_scaling_factor", 1.0);
  c.n_group = value_or<int>(j, "n_group", 1);
  c.topk_group = value_or<int>(j, "topk_group", 1);
}

// quantization_config: its quant_method, and the weight_block_size of FP8 checkpoints (the edge
// blocks of a weight whose shape is not a multiple of the block are partial, so the block size
// cannot be inferred from the scale tensor's shape).
void read_quantization_config(const json& j, ModelConfig& c, const std::string& src) {
  auto q = j.find("quantization_config");
  if (q == j.end() || !q->is_object()) return;
  if (auto m = q->find("quant_method"); m != q->end() && m->is_string()) c.quant_method = m->get<std::string>();
  auto b = q->find("weight_block_size");
  if (b == q->end() || b->is_null()) return;
  if (!b->is_array() || b->size() != 2 || !(*b)[0].is_number_integer() || !(*b)[1].is_number_integer() ||
      (*b)[0].get<long long>() <= 0 || (*b)[1].get<long long>() <= 0 || (*b)[0].get<long long>() > (1 << 20) ||
      (*b)[1].get<long long>() > (1 << 20))
    fail(ErrorKind::bad_file, src + ": quantization_config.weight_block_size must be two positive integers, e.g. [128, 128]");
  c.fp8_block_rows = (*b)[0].get<int>();
  c.fp8_block_cols = (*b)[1].get<int>();
}

}  // namespace

double lora_scaling(double alpha, int rank, bool use_rslora) {
  if (rank <= 0) return 0.0;
  return use_rslora ? alpha / std::sqrt(static_cast<double>(rank)) : alpha / rank;
}

bool ModelConfig::is_moe_layer(int layer) const {
  return std::find(moe_layers.begin(), moe_layers.end(), layer) != moe_layers.end();
}

bool ModelConfig::is_hash_routed(int layer) const {
  return std::find(hash_routed_layers.begin(), hash_routed_layers.end(), layer) != hash_routed_layers.end();
}

std::string ModelConfig::moe_layers_string() const {
  std::ostringstream os;
  for (std::size_t i = 0; i < moe_layers.size(); ++i) os << (i ? ", " : "") << moe_layers[i];
  return os.str();
}

ModelConfig parse_model_config(const std::string& text, const std::string& src) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    fail(ErrorKind::bad_file, src + ": not valid JSON (" + e.what() + ")");
  }
  if (!j.is_object()) fail(ErrorKind::bad_file, src + ": not a JSON object");
  ModelConfig c;
  read_quantization_config(j, c, src);
  const bool remote_code = j.contains("auto_map");
  // Multimodal wrappers keep the language model's config under text_config.
  if (!j.contains("hidden_size") && j.contains("text_config") && j["text_config"].is_object()) j = j["text_config"];

  c.model_type = value_or<std::string>(j, "model_type", "");
  c.shape.hidden = require_int(j, "hidden_size", src);
  c.num_layers = require_int(j, "num_hidden_layers", src);
  // The top-k under transformers' name, or as ERNIE-4.5 (moe_k), Hunyuan (moe_topk, maybe one per
  // layer) and Kimi-Linear (num_experts_per_token) write it.
  const char* top_k_key = "num_experts_per_tok";
  for (const char* alias : {"moe_k", "moe_topk", "num_experts_per_token"})
    if (!j.contains(top_k_key) && j.contains(alias)) top_k_key = alias;
  c.shape.top_k = require_uniform_int(j, top_k_key, src);
  const std::string& t = c.model_type;
  // Routed experts that compute something else than down(silu(gate(x)) * up(x)) weighted by the
  // router: refused by name, as their configs would otherwise pass for Mixtral's.
  if (t == "llama4" || t == "llama4_text")
    fail(ErrorKind::unsupported, src + ": model_type '" + t + "': Llama 4 scales each expert's input by its router score, where "
                                       "tilemoe weights the experts' outputs (DeepSeek-V2/V3, Qwen2/Qwen3-MoE, Mixtral)");
  if (t == "minimax_m3_vl" || t == "minimax_m3_vl_text")
    fail(ErrorKind::unsupported, src + ": model_type '" + t + "': its experts' output is not down(silu(gate(x)) * up(x)) (as transformers v5 "
                                       "computes them, checked by tilemoe's tests), which is what tilemoe runs");
  // DeepSeek-V4 and gpt-oss clamp gate and up before the SwiGLU (MoeShape::swiglu_limit). Another
  // type's clamp may be another formula: refused unless checked.
  if (auto limit = j.find("swiglu_limit"); limit != j.end() && !limit->is_null()) {
    if (t != "deepseek_v4" && t != "gpt_oss")
      fail(ErrorKind::unsupported, src + ": model_type '" + t + "': its experts clamp gate and up at swiglu_limit " + limit->dump() +
                                       ", and tilemoe computes that clamp as DeepSeek-V4's (gate <= limit, up within +-limit), checked "
                                       "against transformers for model_type 'deepseek_v4' only");
    if (!limit->is_number() || !valid_swiglu_limit(limit->get<double>()) || limit->get<double>() == 0.0)
      fail(ErrorKind::bad_file, src + ": swiglu_limit is " + limit->dump() + "; it must be a finite number > 0 (or absent)");
    c.shape.swiglu_limit = limit->get<float>();
  }
  if (t == "jetmoe")
    fail(ErrorKind::unsupported, src + ": model_type 'jetmoe': its MoE adds an output bias and its attention has experts of its own, "
                                       "which tilemoe does not read (it runs down(silu(gate(x)) * up(x)))");
  // The experts compute silu(gate) * up: another activation would be run as silu unseen.
  for (const char* key : {"hidden_act", "activation_function"})
    if (auto a = j.find(key); a != j.end() && a->is_string() && *a != "silu" && *a != "swish")
      fail(ErrorKind::unsupported, src + ": " + key + " is '" + a->get<std::string>() +
                                       "'; tilemoe's experts compute down(silu(gate(x)) * up(x))");
  if (t == "gpt_oss") {
    // GptOssExperts: (clamp(up, -7, 7) + 1) * g * sigmoid(1.702 g), g = min(gate, 7) (its limit is
    // config.json's swiglu_limit, GptOssConfig's default 7.0; alpha is fixed in the module), with
    // biases; every layer MoE; GptOssTopKRouter softmaxes the top-k of its biased logits, which is
    // a softmax over all experts renormalised over the top-k.
    c.shape.intermediate = require_int(j, "intermediate_size", src);
    c.shape.num_experts = require_int(j, "num_local_experts", src);
    for (int l = 0; l < c.num_layers; ++l) c.moe_layers.push_back(l);
    if (c.shape.swiglu_limit == 0.0f) c.shape.swiglu_limit = 7.0f;
    c.shape.swiglu_alpha = 1.702f;
    c.shape.swiglu_up_offset = 1.0f;
    c.norm_topk_prob = true;
    c.gpt_oss_layout = true;
  } else if (t.rfind("deepseek", 0) == 0 || j.contains("n_routed_experts")) {
    c.shape.intermediate = require_int(j, "moe_intermediate_size", src);
    c.shape.num_experts = require_int(j, "n_routed_experts", src);
    c.moe_layers = deepseek_moe_layers(j, c.num_layers);
    read_deepseek_router(j, c);
  } else if (t == "exaone_moe") {
    // EXAONE-MoE: Qwen's names for the experts' size and count, DeepSeek-V3's router, and the MoE
    // layers said one by one in mlp_layer_types (read below).
    read_qwen_moe(j, "num_experts", c, src);
    read_deepseek_router(j, c);
  } else if (t == "minimax_m2") {
    // MiniMax-M2: Mixtral's names (intermediate_size the experts'), every layer MoE, a sigmoid router.
    c.shape.intermediate = require_int(j, "intermediate_size", src);
    c.shape.num_experts = require_int(j, j.contains("num_local_experts") ? "num_local_experts" : "num_experts", src);
    for (int l = 0; l < c.num_layers; ++l) c.moe_layers.push_back(l);
    read_deepseek_router(j, c);
  } else if (t == "ernie4_5_moe") {
    // ERNIE-4.5: Ernie4_5_MoeTopKRouter scores by softmax, chooses by score + the moe_statics
    // correction bias, weighs by the score alone and renormalises (dividing by the sum clamped to
    // moe_norm_min, 1e-12: the same as DeepSeek-V3's + 1e-20 for a softmax's top-k).
    c.shape.intermediate = require_int(j, "moe_intermediate_size", src);
    c.shape.num_experts = require_int(j, j.contains("moe_num_experts") ? "moe_num_experts" : "num_experts", src);
    c.moe_layers = ernie_moe_layers(j, c.num_layers);
    c.topk_method = "noaux_tc";
    c.norm_topk_prob = true;
  } else if (t == "hunyuan_v1_moe") {
    // Hunyuan-MoE: every layer MoE beside a shared MLP; HunYuanMoEV1Gate renormalises its softmax
    // top-k. The experts' size as moe_intermediate_size where written (one per layer), else
    // intermediate_size (HunYuanMoEV1Experts).
    c.shape.intermediate =
        require_uniform_int(j, j.contains("moe_intermediate_size") ? "moe_intermediate_size" : "intermediate_size", src);
    c.shape.num_experts = require_uniform_int(j, "num_experts", src);
    for (int l = 0; l < c.num_layers; ++l) c.moe_layers.push_back(l);
    c.norm_topk_prob = true;
  } else if (t == "olmoe" || t == "flex_olmo") {
    // OLMoE: every layer MoE, intermediate_size the experts' own; OlmoeSparseMoeBlock renormalises
    // its top-k only with norm_topk_prob (default off). The count under either name (v5 may write
    // num_local_experts, which would otherwise read as Mixtral's, always renormalised).
    c.shape.intermediate = require_int(j, "intermediate_size", src);
    c.shape.num_experts = require_int(j, j.contains("num_experts") ? "num_experts" : "num_local_experts", src);
    for (int l = 0; l < c.num_layers; ++l) c.moe_layers.push_back(l);
    c.norm_topk_prob = value_or<bool>(j, "norm_topk_prob", false);
  } else if (j.contains("moe_intermediate_size") && j.contains("num_local_experts") && !j.contains("num_experts")) {
    read_qwen_moe(j, "num_local_experts", c, src);  // Qwen3-MoE as transformers v5 writes it: Mixtral's name for the count
  } else if (j.contains("num_local_experts")) {  // Mixtral: every layer is MoE (GraniteMoE too: a softmax of the top-k logits is the same)
    c.shape.intermediate = require_int(j, "intermediate_size", src);
    c.shape.num_experts = require_int(j, "num_local_experts", src);
    for (int l = 0; l < c.num_layers; ++l) c.moe_layers.push_back(l);
    c.norm_topk_prob = true;  // MixtralSparseMoeBlock always renormalises its top-k
  } else if (j.contains("num_experts")) {  // Qwen2-MoE, Qwen3-MoE
    read_qwen_moe(j, "num_experts", c, src);
  } else {
    fail(ErrorKind::bad_file, src + ": model_type '" + t +
                                  "' has no routed experts this runtime knows (DeepSeek-V2/V3, GLM-4-MoE, Qwen2/Qwen3-MoE, Mixtral, OLMoE, ERNIE-4.5, "
                                  "Hunyuan-MoE, GraniteMoE)");
  }
  // Sigmoid routers of types read by another branch's names (HY-V3, AFMoE and Kimi-Linear by Qwen's).
  if (sigmoid_router_of(t)) read_deepseek_router(j, c);
  // AFMoE: MoE from layer num_dense_layers on (AfmoeDecoderLayer).
  if (t == "afmoe") {
    c.moe_layers.clear();
    for (int l = std::max(0, value_or<int>(j, "num_dense_layers", 1)); l < c.num_layers; ++l) c.moe_layers.push_back(l);
  }
  // Qwen3.5-MoE's router renormalises its top-k whatever config.json says (checked against transformers v5).
  if (t == "qwen3_5_moe_text") c.norm_topk_prob = true;
  // A list of "sparse" / "dense", one per layer (EXAONE-MoE), says which layers are MoE; DeepSeek-V4's
  // of "moe" / "hash_moe" says which of its MoE layers choose experts by token id.
  const bool v4 = t == "deepseek_v4";
  if (auto types = j.find("mlp_layer_types"); types != j.end() && types->is_array()) {
    if (static_cast<int>(types->size()) != c.num_layers)
      fail(ErrorKind::bad_file, src + ": mlp_layer_types has " + std::to_string(types->size()) + " entries for " +
                                    std::to_string(c.num_layers) + " layers");
    c.moe_layers.clear();
    for (int l = 0; l < c.num_layers; ++l) {
      const json& v = (*types)[static_cast<std::size_t>(l)];
      const char* a = v4 ? "moe" : "sparse";
      const char* b = v4 ? "hash_moe" : "dense";
      if (!v.is_string() || (v != a && v != b))
        fail(ErrorKind::bad_file, src + ": mlp_layer_types[" + std::to_string(l) + "] is " + v.dump() + ", not \"" + a + "\" or \"" + b + "\"");
      if (v4 || v == "sparse") c.moe_layers.push_back(l);
      if (v4 && v == "hash_moe") c.hash_routed_layers.push_back(l);
    }
  } else if (v4) {
    // DeepseekV4Config's default: the first num_hash_layers (3) hash-routed.
    for (int l = 0; l < std::min(c.num_layers, value_or<int>(j, "num_hash_layers", 3)); ++l) c.hash_routed_layers.push_back(l);
  }
  // Routers tilemoe does not compute: the experts run with ids and weights given to them, and
  // routing by the checkpoint's router (forward --tokens) is refused naming the type.
  if (t == "phimoe")
    c.routing_unsupported = "PhiMoE routes with sparsemixer (a masked softmax per top-k slot), which tilemoe's router does not compute";
  if (!t.empty() && c.routing_unsupported.empty() && !router_checked(t) &&
      !(remote_code && j.contains("scoring_func") && j.contains("topk_method")))
    c.routing_unsupported = "tilemoe has not checked this type's router against transformers' (it routes " + routed_types_list() +
                            ", and remote-code models whose config.json states scoring_func and topk_method)";
  if (c.shape.hidden == 0 || c.shape.intermediate == 0 || c.shape.num_experts == 0 || c.shape.top_k == 0)
    fail(ErrorKind::bad_file, src + ": hidden size, expert intermediate size, expert count and top-k must be positive");
  if (c.shape.top_k > c.shape.num_experts)
    fail(ErrorKind::bad_file, src + ": num_experts_per_tok exceeds the number of experts");
  return c;
}

ModelConfig read_model_config(const std::string& model_dir) {
  std::string path = model_dir + "/config.json";
  std::ifstream in(path);
  if (!in) fail(ErrorKind::bad_file, path + ": cannot open (is --model a Hugging Face checkpoint directory?)");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_model_config(ss.str(), path);
}

}  // namespace tilemoe
