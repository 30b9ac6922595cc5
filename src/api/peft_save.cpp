#include "tilemoe/peft_save.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "src/api/layer_peft_state.hpp"
#include "src/lora/lora_view.hpp"
#include "src/lora/peft_export.hpp"
#include "src/model/tensor_names.hpp"
#include "tilemoe/error.hpp"

namespace tilemoe {
namespace {

constexpr const char* kPeftRoot = "base_model.model.";

// A module of one expert's projection, for adapter_config.json: its path in the model
// ("model.layers.3.mlp.experts.7.gate_proj"), its rank and lora_alpha.
struct SavedModule {
  std::string path;
  std::string projection;  // the path's last part, as target_modules names it
  int rank = 0;
  double alpha = 0;
};

std::string replace_all(std::string s, const std::string& what, const std::string& with) {
  for (std::size_t pos = s.find(what); pos != std::string::npos; pos = s.find(what, pos + with.size())) s.replace(pos, what.size(), with);
  return s;
}

// alpha = scale * rank, shortened to six decimals when that gives the same float scale back
// (12 rather than 11.999999523), as PEFT divides it by the rank again.
double alpha_of(float scale, int rank) {
  const double alpha = static_cast<double>(scale) * rank;
  const double shorter = std::round(alpha * 1e6) / 1e6;
  return static_cast<float>(shorter / rank) == scale ? shorter : alpha;
}

// Whether expert e's A rows and B columns from `from` on are all zero: the padding of an expert
// whose adapter gave it a smaller rank, which no gradient makes non-zero.
bool padding_is_zero(const LoraProjectionView& v, int e, int from) {
  auto zero = [&](const void* base, std::size_t i) { return factor_value(base, v.dtype, i) == 0.0f; };
  for (int j = from; j < v.rank; ++j)
    for (int c = 0; c < v.in; ++c)
      if (!zero(v.a_of(e), static_cast<std::size_t>(j) * v.lda() + c)) return false;
  for (int row = 0; row < v.out; ++row)
    for (int j = from; j < v.rank; ++j)
      if (!zero(v.b_of(e), static_cast<std::size_t>(row) * v.rank + j)) return false;
  return true;
}

// The first non-finite element of expert e's A or B ("A[1][7]"), or "" when all are finite: a
// diverged trainer's factors are refused rather than written where no loader takes them back.
std::string first_non_finite(const LoraProjectionView& v, int e) {
  for (int j = 0; j < v.rank; ++j)
    for (int c = 0; c < v.in; ++c)
      if (!std::isfinite(factor_value(v.a_of(e), v.dtype, static_cast<std::size_t>(j) * v.lda() + c)))
        return "A[" + std::to_string(j) + "][" + std::to_string(c) + "]";
  for (int row = 0; row < v.out; ++row)
    for (int j = 0; j < v.rank; ++j)
      if (!std::isfinite(factor_value(v.b_of(e), v.dtype, static_cast<std::size_t>(row) * v.rank + j)))
        return "B[" + std::to_string(row) + "][" + std::to_string(j) + "]";
  return "";
}

io::Dtype dtype_written(PeftSaveDtype choice, LoraDType held) {
  if (choice == PeftSaveDtype::f32) return io::Dtype::F32;
  if (choice == PeftSaveDtype::bf16) return io::Dtype::BF16;
  return held == LoraDType::bf16 ? io::Dtype::BF16 : io::Dtype::F32;
}

// adapter_config.json for per-expert keys: r and lora_alpha those of most modules, rank_pattern /
// alpha_pattern for the others, keyed by the module's path without its first part
// ("layers.3.mlp.experts.7.gate_proj"), which every PEFT version matches as a suffix.
std::string per_expert_config(const std::vector<SavedModule>& modules, const PeftSaveOptions& options) {
  auto most_common = [&](auto field) {
    std::map<decltype(field(modules.front())), int> count;
    auto best = field(modules.front());
    for (const auto& m : modules)
      if (++count[field(m)] > count[best]) best = field(m);
    return best;
  };
  const int r = most_common([](const SavedModule& m) { return m.rank; });
  const double alpha = most_common([](const SavedModule& m) { return m.alpha; });
  auto number = [](double v) {
    return v == std::floor(v) && std::fabs(v) < 1e15 ? nlohmann::ordered_json(static_cast<long long>(v)) : nlohmann::ordered_json(v);
  };
  nlohmann::ordered_json rank_pattern = nlohmann::ordered_json::object(), alpha_pattern = nlohmann::ordered_json::object();
  std::set<std::string> targets;
  for (const auto& m : modules) {
    const std::size_t dot = m.path.find('.');
    const std::string key = dot == std::string::npos ? m.path : m.path.substr(dot + 1);
    if (m.rank != r) rank_pattern[key] = m.rank;
    if (m.alpha != alpha) alpha_pattern[key] = number(m.alpha);
    targets.insert(m.projection);
  }
  nlohmann::ordered_json j;
  j["peft_type"] = "LORA";
  j["r"] = r;
  j["lora_alpha"] = number(alpha);
  j["use_rslora"] = false;
  j["target_modules"] = std::vector<std::string>(targets.begin(), targets.end());
  j["bias"] = "none";
  j["fan_in_fan_out"] = false;
  j["lora_dropout"] = 0.0;
  j["init_lora_weights"] = true;
  j["rank_pattern"] = rank_pattern;
  j["alpha_pattern"] = alpha_pattern;
  j["task_type"] = nullptr;
  j["base_model_name_or_path"] =
      options.base_model_name_or_path.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(options.base_model_name_or_path);
  return j.dump(2) + "\n";
}

}  // namespace

PeftSaveStats save_peft_adapter(const std::string& dir, const std::vector<PeftSaveLayer>& layers, const PeftSaveOptions& options) {
  const std::string who = "save_peft_adapter: " + dir + ": ";
  if (layers.empty()) fail(ErrorKind::invalid_argument, who + "no layers given");
  if (options.dtype != PeftSaveDtype::as_held && options.dtype != PeftSaveDtype::f32 && options.dtype != PeftSaveDtype::bf16)
    fail(ErrorKind::invalid_argument, who + "unknown dtype " + std::to_string(static_cast<int>(options.dtype)));
  if (options.experts_module.find("{layer}") == std::string::npos || options.experts_module.find("{expert}") == std::string::npos)
    fail(ErrorKind::invalid_argument, who + "PeftSaveOptions::experts_module '" + options.experts_module +
                                          "' must hold both {layer} and {expert}, or experts would share keys");
  for (const auto& name : options.projection_names)
    if (name.empty() || name.find('.') != std::string::npos)
      fail(ErrorKind::invalid_argument, who + "PeftSaveOptions::projection_names must be non-empty module names without '.', got '" + name + "'");

  std::vector<LayerPeftState> states;
  states.reserve(layers.size());
  std::vector<PeftLayerOut> outs;
  std::vector<SavedModule> modules;
  std::set<int> seen;
  std::string stacked_config;  // the held adapters' adapter_config.json, when keys are stacked
  std::string stacked_where, per_expert_where;
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const std::string at = who + "layers[" + std::to_string(i) + "]";
    if (!layers[i].layer) fail(ErrorKind::invalid_argument, at + " is null");
    LayerPeftState& st = states.emplace_back(layer_peft_state(*layers[i].layer));
    if (layers[i].index < -1) fail(ErrorKind::invalid_argument, at + ": index " + std::to_string(layers[i].index) + " (-1: the layer's own)");
    if (layers[i].index >= 0 && st.index >= 0 && layers[i].index != st.index)
      fail(ErrorKind::invalid_argument, at + ": index " + std::to_string(layers[i].index) + " given, but the layer is layer " +
                                            std::to_string(st.index) + " of its checkpoint or adapter");
    const int index = layers[i].index >= 0 ? layers[i].index : st.index;
    if (index < 0)
      fail(ErrorKind::invalid_argument, at + ": the layer was made from memory and holds no adapter, so its index in the model is "
                                            "not known; set PeftSaveLayer::index");
    if (!seen.insert(index).second) fail(ErrorKind::invalid_argument, at + ": layer " + std::to_string(index) + " is given twice");
    const std::string where = who + "layer " + std::to_string(index);

    PeftLayerOut out;
    out.layer = index;
    out.num_experts = st.num_experts;
    for (Projection p : kProjections) {
      const int pi = static_cast<int>(p);
      const LoraProjectionView& set = st.view[p];
      if (set.rank == 0) continue;
      out.lora[p] = set;
      const io::Dtype dt = dtype_written(options.dtype, set.dtype);
      const std::string proj_where = where + " " + projection_name(p);
      const int E = out.num_experts;
      for (int e = 0; e < E; ++e)
        if (set.active(e))
          if (const std::string bad = first_non_finite(set, e); !bad.empty())
            fail(ErrorKind::invalid_argument, proj_where + ", expert " + std::to_string(e) + ": LoRA " + bad +
                                                  " is not finite (a diverged step?); PEFT files with it load nowhere");

      if (st.has_adapter && !st.adapter.stacked[pi].empty()) {
        // Written under the adapter's stacked keys: its adapter_config.json says their rank and scale.
        if (set.rank != st.adapter_rank[pi])
          fail(ErrorKind::invalid_argument, proj_where + ": the set in use has rank " + std::to_string(set.rank) +
                                                ", but the adapter's stacked LoRA, whose adapter_config.json is written, has rank " +
                                                std::to_string(st.adapter_rank[pi]));
        for (int e = 0; e < E; ++e) {
          const float mine = set.scale_of(e), theirs = st.adapter_scale[pi][e];
          if (set.active(e) && std::fabs(mine - theirs) > 1e-6f * std::fabs(theirs))
            fail(ErrorKind::invalid_argument, proj_where + ", expert " + std::to_string(e) + ": the set in use scales by " +
                                                  std::to_string(mine) + ", the adapter's stacked LoRA by " + std::to_string(theirs) +
                                                  " (its adapter_config.json is written)");
        }
        if (st.adapter.adapter_config.empty())
          fail(ErrorKind::invalid_argument, proj_where + ": the adapter stacks this LoRA over the experts, but its adapter_config.json "
                                                         "was not kept (a convert-lora file of an older version); convert it again");
        if (stacked_config.empty()) stacked_config = st.adapter.adapter_config, stacked_where = proj_where;
        if (st.adapter.adapter_config != stacked_config)
          fail(ErrorKind::invalid_argument, proj_where + ": its adapter's adapter_config.json differs from that of " + stacked_where +
                                                "; stacked keys are saved with the one adapter_config.json of the adapter they came from");
        out.stacked[pi] = st.adapter.stacked[pi];
        out.stacked[pi].dtype_a = out.stacked[pi].dtype_b = dt;
        for (int e = 0; e < E; ++e) out.expert_rank[pi].push_back(set.rank);
        continue;
      }

      // Per-expert keys: the module of expert {E}.
      std::string module;
      if (st.has_adapter && !st.adapter.key_template_a[pi].empty()) {
        const std::string& t = st.adapter.key_template_a[pi];
        module = t.substr(0, t.find(".lora_A"));
      } else if (!st.checkpoint_modules[pi].empty()) {
        module = kPeftRoot + st.checkpoint_modules[pi];
      } else if (st.checkpoint_stacked) {
        fail(ErrorKind::invalid_argument, proj_where + ": the checkpoint stacks its experts (transformers v5), where PEFT's LoRA is a "
                                                       "target_parameters one under keys only an adapter made for the model gives; load "
                                                       "such an adapter into the layer (its keys are then used)");
      } else {
        module = kPeftRoot + replace_all(replace_all(options.experts_module, "{layer}", std::to_string(index)), "{expert}", "{E}") + "." +
                 options.projection_names[pi];
      }
      out.key_template_a[pi] = module + ".lora_A.weight";
      out.key_template_b[pi] = module + ".lora_B.weight";
      out.dtype_a[pi].assign(E, dt);
      out.dtype_b[pi].assign(E, dt);
      out.expert_rank[pi].assign(E, 0);
      if (per_expert_where.empty()) per_expert_where = proj_where;
      for (int e = 0; e < E; ++e) {
        if (!set.active(e)) continue;
        int r = set.rank;
        if (st.has_adapter && static_cast<int>(st.adapter_expert_rank[pi].size()) == E) {
          const int held = st.adapter_expert_rank[pi][e];
          if (held > 0 && held < r && padding_is_zero(set, e, held)) r = held;
        }
        out.expert_rank[pi][e] = r;
        std::string path = expand_expert_key_template(module, e);
        if (path.rfind(kPeftRoot, 0) == 0) path.erase(0, std::string(kPeftRoot).size());
        const std::size_t last = path.rfind('.');
        modules.push_back({path, last == std::string::npos ? path : path.substr(last + 1), r, alpha_of(set.scale_of(e), r)});
      }
    }
    outs.push_back(std::move(out));
  }
  if (!stacked_config.empty() && !per_expert_where.empty())
    fail(ErrorKind::invalid_argument, who + stacked_where + " is saved under an adapter's stacked keys, " + per_expert_where +
                                          " under per-expert keys: one adapter_config.json cannot say both here (load the same "
                                          "kind of adapter into every layer)");
  if (stacked_config.empty() && modules.empty())
    fail(ErrorKind::invalid_argument, who + "no layer has LoRA to save (none given by update_lora_weights or load_adapter)");

  PeftExportOptions eo;
  eo.dtype = ExportDtype::same;  // the dtypes chosen above
  const std::string config = stacked_config.empty() ? per_expert_config(modules, options) : stacked_config;
  const PeftExportStats st = write_peft_layers(dir, config, outs, eo);
  return {st.layers, st.expert_tensors, st.bytes};
}

}  // namespace tilemoe
