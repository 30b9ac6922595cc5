#include "tools/model_report.hpp"

#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <vector>

#include "src/io/dtype.hpp"
#include "src/model/checkpoint.hpp"
#include "src/model/tensor_names.hpp"
#include "tilemoe/error.hpp"

namespace tilemoe::cli {
namespace {

using nlohmann::json;

// "layers.7." -> "layers.{L}.", so that layers stored alike compare equal.
std::string layer_template(const std::string& name, int layer) {
  const std::string needle = "layers." + std::to_string(layer) + ".";
  const std::size_t at = name.find(needle);
  return at == std::string::npos ? name : name.substr(0, at) + "layers.{L}." + name.substr(at + needle.size());
}

// How one MoE layer is stored, with the layer index taken out.
struct LayerNaming {
  std::array<std::string, 3> experts;  // per projection: a name template, "(stacked, rows from R)" appended for stacks
  std::string dtype;
  std::string router, correction_bias;
  bool operator<(const LayerNaming& o) const {
    return std::tie(experts, dtype, router, correction_bias) < std::tie(o.experts, o.dtype, o.router, o.correction_bias);
  }
};

LayerNaming naming_of(const Checkpoint& ck, int layer) {
  LayerNaming n;
  const auto refs = ck.expert_tensors(layer);
  for (Projection p : kProjections) {
    const ExpertTensorRef& r = refs[static_cast<int>(p)].front();
    std::string t = layer_template(r.stacked() ? r.name : expert_key_template(r.name, 0), layer);
    if (r.row_step > 1)  // gpt-oss: gate and up interleaved
      t += std::string(" (every expert stacked") + (r.transposed ? " as x W" : "") + ", outputs " + std::to_string(r.first_row) + ", " +
           std::to_string(r.first_row + r.row_step) + ", ...)";
    else if (r.stacked())
      t += " (every expert stacked" + std::string(r.transposed ? " as x W" : "") +
           (r.first_row ? ", rows from " + std::to_string(r.first_row) : std::string()) + ")";
    n.experts[static_cast<int>(p)] = t;
    if (p == Projection::gate) n.dtype = r.scales.empty() ? io::dtype_name(ck.file_of(r.name)->get(r.name).dtype) : "MXFP4";
  }
  const auto router = ck.router_tensor_names(layer);
  n.router = layer_template(router[0], layer);
  if (router.size() > 1) n.correction_bias = layer_template(router[1], layer);
  return n;
}

std::string layer_list(const std::vector<int>& layers) {  // "1-26" or "0, 2, 4"
  std::string out;
  for (std::size_t i = 0; i < layers.size();) {
    std::size_t j = i;
    while (j + 1 < layers.size() && layers[j + 1] == layers[j] + 1) ++j;
    if (!out.empty()) out += ", ";
    out += std::to_string(layers[i]);
    if (j > i) {
      out += j > i + 1 ? "-" : ", ";  // a run of three or more, or two apart
      out += std::to_string(layers[j]);
    }
    i = j + 1;
  }
  return out.empty() ? "none" : out;
}

std::string router_text(const ModelConfig& c) {
  if (!c.routing_unsupported.empty())
    return "not computed by tilemoe (" + c.routing_unsupported + "); the experts run with ids and weights given to them";
  std::string s = c.scoring_func + " scores, " + c.topk_method + " top-" + std::to_string(c.shape.top_k);
  if (c.topk_method != "greedy") s += " (" + std::to_string(c.n_group) + " groups, best " + std::to_string(c.topk_group) + ")";
  s += c.norm_topk_prob ? ", renormalised" : ", not renormalised";
  char scale[32];
  std::snprintf(scale, sizeof scale, "%g", c.routed_scaling_factor);
  s += std::string(", scaled by ") + scale;
  if (!c.hash_routed_layers.empty())
    s += "; layers " + layer_list(c.hash_routed_layers) + " choose experts by token id (hash routing): not computed, their experts run with "
         "ids given to them";
  return s;
}

}  // namespace

int print_model_report(const std::string& model_dir, bool as_json) {
  const Checkpoint ck = Checkpoint::open(model_dir);
  const ModelConfig& c = ck.config();
  std::map<LayerNaming, std::vector<int>> namings;
  std::vector<std::pair<int, std::string>> errors;
  for (int layer : c.moe_layers) {
    try {
      namings[naming_of(ck, layer)].push_back(layer);
    } catch (const Error& e) {
      errors.emplace_back(layer, e.what());
    }
  }
  const int status = errors.empty() ? 0 : 1;
  if (as_json) {
    json out = {{"model_dir", model_dir}, {"model_type", c.model_type}, {"hidden", c.shape.hidden},
                {"intermediate", c.shape.intermediate}, {"experts", c.shape.num_experts}, {"top_k", c.shape.top_k},
                {"moe_layers", c.moe_layers}, {"quant_method", c.quant_method}, {"swiglu_limit", c.shape.swiglu_limit},
                {"swiglu_alpha", c.shape.swiglu_alpha}, {"swiglu_up_offset", c.shape.swiglu_up_offset},
                {"expert_biases", c.gpt_oss_layout}};
    json router = {{"computed", c.routing_unsupported.empty()}};
    if (c.routing_unsupported.empty())
      router.update({{"scoring_func", c.scoring_func}, {"topk_method", c.topk_method}, {"n_group", c.n_group}, {"topk_group", c.topk_group},
                     {"norm_topk_prob", c.norm_topk_prob}, {"routed_scaling_factor", c.routed_scaling_factor},
                     {"hash_routed_layers", c.hash_routed_layers}});
    else
      router["reason"] = c.routing_unsupported;
    out["router"] = router;
    json stored = json::array();
    for (const auto& [n, layers] : namings)
      stored.push_back({{"layers", layers}, {"gate", n.experts[0]}, {"up", n.experts[1]}, {"down", n.experts[2]}, {"dtype", n.dtype},
                        {"router", n.router}, {"correction_bias", n.correction_bias}});
    out["stored"] = stored;
    json errs = json::array();
    for (const auto& [layer, what] : errors) errs.push_back({{"layer", layer}, {"error", what}});
    out["errors"] = errs;
    std::printf("%s\n", out.dump().c_str());
    return status;
  }
  std::printf("model: %s (model_type '%s')\n", model_dir.c_str(), c.model_type.c_str());
  std::printf("experts: hidden %d, intermediate %d, %d experts, top-%d; %zu MoE layers: %s\n", c.shape.hidden, c.shape.intermediate,
              c.shape.num_experts, c.shape.top_k, c.moe_layers.size(), layer_list(c.moe_layers).c_str());
  if (c.shape.swiglu_limit > 0)
    std::printf("SwiGLU: gate clamped to at most %g and up to [-%g, %g] first (swiglu_limit)\n", c.shape.swiglu_limit, c.shape.swiglu_limit,
                c.shape.swiglu_limit);
  if (c.shape.swiglu_alpha != 1.0f || c.shape.swiglu_up_offset != 0.0f)
    std::printf("SwiGLU in gpt-oss's form: (up + %g) * gate * sigmoid(%g * gate)\n", c.shape.swiglu_up_offset, c.shape.swiglu_alpha);
  if (c.gpt_oss_layout)
    std::printf("experts: gpt-oss's x W tensors (gate and up interleaved, or MXFP4 blocks) with biases; router logits with a bias\n");
  std::printf("router: %s\n", router_text(c).c_str());
  if (!c.quant_method.empty())
    std::printf("quantization_config: quant_method '%s'%s\n", c.quant_method.c_str(),
                c.quant_method == "mxfp4" ? " (read as bf16 by default; --weights mxfp4 keeps the experts' MXFP4 values exactly, "
                                            "4.25 bits a weight)"
                                          : "");
  for (const auto& [n, layers] : namings) {
    std::printf("layers %s, stored as (%s):\n", layer_list(layers).c_str(), n.dtype.c_str());
    const char* names[3] = {"gate", "up", "down"};
    for (int p = 0; p < 3; ++p) std::printf("  %-6s %s\n", names[p], n.experts[p].c_str());
    std::printf("  router %s%s\n", n.router.c_str(), n.correction_bias.empty() ? "" : (", bias " + n.correction_bias).c_str());
  }
  for (const auto& [layer, what] : errors) std::printf("layer %d: not readable: %s\n", layer, what.c_str());
  std::printf(errors.empty() ? "every MoE layer's experts and router read\n" : "%zu of %zu MoE layers do not read\n", errors.size(),
              c.moe_layers.size());
  return status;
}

}  // namespace tilemoe::cli
