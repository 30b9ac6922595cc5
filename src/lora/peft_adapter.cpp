#include "src/lora/peft_adapter.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "src/lora/lora_file.hpp"
#include "src/model/finite_check.hpp"
#include "src/model/tensor_names.hpp"
#include "tilemoe/error.hpp"

namespace tilemoe {
namespace fs = std::filesystem;
namespace {

using nlohmann::json;

// PEFT matches rank_pattern/alpha_pattern keys against module names with
// re.match(rf"(.*\.)?({key})$", name).
template <typename V>
const V* match_pattern(const std::vector<std::pair<std::string, V>>& patterns, const std::string& module) {
  for (const auto& [key, value] : patterns) {
    if (module == key || (module.size() > key.size() && module.compare(module.size() - key.size(), key.size(), key) == 0 &&
                          module[module.size() - key.size() - 1] == '.'))
      return &value;
    try {
      if (std::regex_match(module, std::regex("(.*\\.)?(" + key + ")"))) return &value;
    } catch (const std::regex_error&) {
      // Not a regex: the literal comparison above was the whole test.
    }
  }
  return nullptr;
}

std::string module_name(const std::string& key) {
  std::size_t pos = key.find(".lora_");
  std::string m = key.substr(0, pos);
  const std::string prefix = "base_model.model.";
  if (m.rfind(prefix, 0) == 0) m = m.substr(prefix.size());
  return m;
}

}  // namespace

PeftConfig read_peft_config(const std::string& adapter_dir) {
  std::string path = adapter_dir + "/adapter_config.json";
  std::ifstream in(path);
  if (!in) fail(ErrorKind::bad_file, path + ": cannot open (is --adapter a PEFT adapter directory?)");
  std::stringstream ss;
  ss << in.rdbuf();
  PeftConfig c;
  c.json_text = ss.str();
  json j;
  try {
    j = json::parse(c.json_text);
  } catch (const json::exception& e) {
    fail(ErrorKind::bad_file, path + ": not valid JSON (" + e.what() + ")");
  }
  if (!j.is_object()) fail(ErrorKind::bad_file, path + ": not a JSON object");
  if (j.contains("peft_type") && j["peft_type"].is_string() && j["peft_type"] != "LORA")
    fail(ErrorKind::unsupported, path + ": peft_type is " + j["peft_type"].get<std::string>() + "; only LORA adapters are supported");
  if (j.value("use_dora", false)) fail(ErrorKind::unsupported, path + ": DoRA adapters (use_dora) are not supported");
  // Ranks past 2^20 are no LoRA's; refused here, they would wrap in an int.
  if (!j.contains("r") || !j["r"].is_number_integer() || j["r"].get<long long>() <= 0 || j["r"].get<long long>() > (1 << 20))
    fail(ErrorKind::bad_file, path + ": 'r' must be a positive integer (at most 2^20)");
  c.r = j["r"].get<int>();
  if (!j.contains("lora_alpha") || !j["lora_alpha"].is_number()) fail(ErrorKind::bad_file, path + ": 'lora_alpha' must be a number");
  c.lora_alpha = j["lora_alpha"].get<double>();
  c.use_rslora = j.value("use_rslora", false);
  if (j.contains("rank_pattern") && j["rank_pattern"].is_object())
    for (auto& [k, v] : j["rank_pattern"].items()) {
      if (!v.is_number_integer() || v.get<long long>() <= 0 || v.get<long long>() > (1 << 20))
        fail(ErrorKind::bad_file, path + ": rank_pattern['" + k + "'] must be a positive integer (at most 2^20)");
      c.rank_pattern.emplace_back(k, v.get<int>());
    }
  if (j.contains("target_parameters") && j["target_parameters"].is_array())
    for (const auto& v : j["target_parameters"]) {
      if (!v.is_string()) fail(ErrorKind::bad_file, path + ": target_parameters must be a list of parameter names");
      c.target_parameters.push_back(v.get<std::string>());
    }
  if (j.contains("alpha_pattern") && j["alpha_pattern"].is_object())
    for (auto& [k, v] : j["alpha_pattern"].items()) {
      if (!v.is_number()) fail(ErrorKind::bad_file, path + ": alpha_pattern['" + k + "'] must be a number");
      c.alpha_pattern.emplace_back(k, v.get<double>());
    }
  return c;
}

PeftAdapter PeftAdapter::open(const std::string& adapter_dir, const ModelConfig& model) {
  PeftAdapter ad;
  ad.dir_ = adapter_dir;
  ad.config_ = read_peft_config(adapter_dir);
  ad.file_path_ = adapter_dir + "/adapter_model.safetensors";
  if (!fs::exists(ad.file_path_)) {
    if (fs::exists(adapter_dir + "/adapter_model.bin"))
      fail(ErrorKind::unsupported, adapter_dir + ": only adapter_model.bin (a pickle) is there; save the adapter with safe_serialization=True");
    fail(ErrorKind::bad_file, ad.file_path_ + ": missing");
  }
  ad.file_ = std::make_unique<io::SafetensorsFile>(io::SafetensorsFile::open(ad.file_path_));
  const MoeShape& s = model.shape;
  const std::string& path = ad.file_path_;

  std::map<std::string, std::pair<const io::TensorInfo*, const io::TensorInfo*>> stacked_pairs;  // pair key -> A, B
  for (const auto& t : ad.file_->tensors()) {
    auto parsed = parse_expert_tensor_name(t.name);
    if (!parsed || !parsed->lora) {
      if (auto stacked = parse_stacked_lora_name(t.name)) {
        if (stacked->bias)
          fail(ErrorKind::unsupported, path + ": layer " + std::to_string(stacked->layer) + " experts LoRA ('" + t.name +
                                           "'): a bias on a LoRA factor (PEFT's lora_bias) is not supported");
        auto& pair = stacked_pairs[stacked->pair_key];
        (stacked->factor == LoraFactor::a ? pair.first : pair.second) = &t;
        ++ad.expert_keys_;
        continue;
      }
      ad.other_keys_.push_back(t.name);
      continue;
    }
    ++ad.expert_keys_;
    Projection p = parsed->projection;
    std::string where = path + ": layer " + std::to_string(parsed->layer) + " expert " + std::to_string(parsed->expert) + " " +
                        projection_name(p) + " LoRA " + (parsed->lora == LoraFactor::a ? "A" : "B") + " ('" + t.name + "')";
    if (parsed->bias)
      fail(ErrorKind::unsupported, where + ": a bias on a LoRA factor (PEFT's lora_bias) is not supported; only the A and B "
                                   "weights of each expert projection are read");
    if (!model.is_moe_layer(parsed->layer))
      fail(ErrorKind::bad_file, where + ": the model's layer " + std::to_string(parsed->layer) + " is not a MoE layer (MoE layers: " +
                                    model.moe_layers_string() + ")");
    if (parsed->expert >= s.num_experts)
      fail(ErrorKind::bad_file, where + ": the model has only " + std::to_string(s.num_experts) + " experts");
    if (t.shape.size() != 2) fail(ErrorKind::bad_file, where + ": shape " + io::shape_string(t.shape) + " is not 2-D");
    if (t.dtype != io::Dtype::BF16 && t.dtype != io::Dtype::F16 && t.dtype != io::Dtype::F32)
      fail(ErrorKind::bad_file, where + ": dtype " + io::dtype_name(t.dtype) + " is not BF16, F16 or F32");
    auto& layer = ad.layers_[parsed->layer];
    for (auto& v : layer)
      if (v.empty()) v.resize(s.num_experts);
    auto& entry = layer[static_cast<int>(p)][parsed->expert];
    std::string& slot = parsed->lora == LoraFactor::a ? entry.key_a : entry.key_b;
    if (!slot.empty()) fail(ErrorKind::bad_file, where + ": stored twice (also as '" + slot + "')");
    slot = t.name;
  }

  for (auto& [layer, projs] : ad.layers_) {
    for (Projection p : kProjections) {
      for (int e = 0; e < s.num_experts; ++e) {
        auto& entry = projs[static_cast<int>(p)][e];
        if (entry.key_a.empty() && entry.key_b.empty()) continue;
        std::string where = path + ": layer " + std::to_string(layer) + " expert " + std::to_string(e) + " " + projection_name(p);
        if (entry.key_a.empty() || entry.key_b.empty())
          fail(ErrorKind::bad_file, where + ": has lora_" + std::string(entry.key_a.empty() ? "B" : "A") + " but no lora_" +
                                        (entry.key_a.empty() ? "A" : "B"));
        const auto& a = ad.file_->get(entry.key_a);
        const auto& b = ad.file_->get(entry.key_b);
        int in = projection_in(s, p), out = projection_out(s, p);
        if (a.shape[0] != b.shape[1])
          fail(ErrorKind::bad_file, where + ": rank differs between A " + io::shape_string(a.shape) + " and B " + io::shape_string(b.shape));
        if (a.shape[1] != in || b.shape[0] != out)
          fail(ErrorKind::bad_file, where + ": A " + io::shape_string(a.shape) + " and B " + io::shape_string(b.shape) +
                                        " do not fit the model (expected A [r, " + std::to_string(in) + "], B [" + std::to_string(out) + ", r])");
        int rank = static_cast<int>(a.shape[0]);
        std::string module = module_name(entry.key_a);
        const int* pattern_rank = match_pattern(ad.config_.rank_pattern, module);
        int config_rank = pattern_rank ? *pattern_rank : ad.config_.r;
        if (rank != config_rank)
          fail(ErrorKind::bad_file, where + ": tensors have rank " + std::to_string(rank) + " but adapter_config.json says " +
                                        std::to_string(config_rank));
        const double* pattern_alpha = match_pattern(ad.config_.alpha_pattern, module);
        entry.rank = rank;
        entry.scale = lora_scaling(pattern_alpha ? *pattern_alpha : ad.config_.lora_alpha, rank, ad.config_.use_rslora);
      }
    }
  }
  for (const auto& [pair_key, pair] : stacked_pairs) ad.add_stacked_pair(pair_key, pair.first, pair.second, model);
  if (ad.expert_keys_ == 0)
    ad.warnings_.push_back(path + ": no routed-expert LoRA keys (" + std::to_string(ad.other_keys_.size()) +
                           " other keys ignored); the experts run without LoRA");
  return ad;
}

void PeftAdapter::add_stacked_pair(const std::string& pair_key, const io::TensorInfo* a, const io::TensorInfo* b, const ModelConfig& model) {
  const MoeShape& s = model.shape;
  const std::string& path = file_path_;
  const auto parsed = parse_stacked_lora_name((a ? a : b)->name);
  const int layer = parsed->layer;
  std::string where = path + ": layer " + std::to_string(layer) + " experts LoRA ('" + pair_key + ".lora_A/B')";
  if (!a || !b) fail(ErrorKind::bad_file, where + ": has lora_" + std::string(a ? "A" : "B") + " but no lora_" + (a ? "B" : "A"));
  if (!model.is_moe_layer(layer))
    fail(ErrorKind::bad_file, where + ": the model's layer " + std::to_string(layer) + " is not a MoE layer (MoE layers: " +
                                  model.moe_layers_string() + ")");
  for (const auto* t : {a, b}) {
    if (t->shape.size() != 2) fail(ErrorKind::bad_file, where + ": '" + t->name + "' has shape " + io::shape_string(t->shape) + ", not 2-D");
    if (t->dtype != io::Dtype::BF16 && t->dtype != io::Dtype::F16 && t->dtype != io::Dtype::F32)
      fail(ErrorKind::bad_file, where + ": '" + t->name + "' has dtype " + io::dtype_name(t->dtype) + ", not BF16, F16 or F32");
  }
  const std::int64_t E = s.num_experts, H = s.hidden, I = s.intermediate;
  const std::string shapes = "A " + io::shape_string(a->shape) + " and B " + io::shape_string(b->shape);
  if (a->shape[0] != b->shape[1] || a->shape[0] % E != 0 || a->shape[0] == 0)
    fail(ErrorKind::bad_file, where + ": " + shapes + " are not a LoRA of rank r over the model's " + std::to_string(E) +
                                  " experts stacked (A [r*" + std::to_string(E) + ", in], B [out, r*" + std::to_string(E) + "])");
  // The stacked tensor it belongs to, from in and out (and target_parameters where shapes allow two).
  struct Candidate {
    const char* parameter;
    std::vector<std::pair<Projection, int>> parts;
    std::int64_t in, out;
    std::vector<std::string> tokens;
  };
  // gpt-oss's gate_up_proj interleaves gate's and up's outputs (rows 0, 2, ... and 1, 3, ... of B).
  const bool interleaved = model.gpt_oss_layout;
  const std::vector<Candidate> candidates = {
      {"gate_up_proj", {{Projection::gate, 0}, {Projection::up, interleaved ? 1 : static_cast<int>(I)}}, H, 2 * I, {"gate_up_proj"}},
      {"down_proj", {{Projection::down, 0}}, I, H, {"down_proj", "w2"}},
      {"gate_proj", {{Projection::gate, 0}}, H, I, {"gate_proj", "w1"}},
      {"up_proj", {{Projection::up, 0}}, H, I, {"up_proj", "w3"}},
  };
  auto targeted = [&](const Candidate& c) {
    for (const auto& t : config_.target_parameters)
      for (const auto& token : c.tokens)
        if (t == token || (t.size() > token.size() && t.compare(t.size() - token.size() - 1, token.size() + 1, "." + token) == 0))
          return true;
    return false;
  };
  std::vector<const Candidate*> fits;
  for (const auto& c : candidates)
    if (a->shape[1] == c.in && b->shape[0] == c.out) fits.push_back(&c);
  if (fits.size() > 1) {
    std::vector<const Candidate*> named;
    for (const auto* c : fits)
      if (targeted(*c)) named.push_back(c);
    fits = named;
  }
  if (fits.empty())
    fail(ErrorKind::bad_file, where + ": " + shapes + " do not fit the model's stacked experts (A [r*E, " + std::to_string(H) + "] and B [" +
                                  std::to_string(2 * I) + ", r*E] for gate_up_proj, A [r*E, " + std::to_string(I) + "] and B [" +
                                  std::to_string(H) + ", r*E] for down_proj), or fit several and target_parameters names none of them");
  if (fits.size() > 1)
    fail(ErrorKind::unsupported, where + ": " + shapes + " fit more than one of the layer's stacked expert tensors and "
                                     "adapter_config.json's target_parameters names several of them; which one this pair is cannot be told");
  const Candidate& c = *fits.front();
  PeftStackedEntry entry;
  entry.key_a = a->name;
  entry.key_b = b->name;
  entry.parameter = parsed->module + "." + c.parameter;
  entry.parts = c.parts;
  entry.row_step = interleaved && c.parts.size() == 2 ? 2 : 1;
  entry.rank = static_cast<int>(a->shape[0] / E);
  const int* pattern_rank = match_pattern(config_.rank_pattern, entry.parameter);
  const int config_rank = pattern_rank ? *pattern_rank : config_.r;
  if (entry.rank != config_rank)
    fail(ErrorKind::bad_file, where + ": " + shapes + " have rank " + std::to_string(entry.rank) + " over " + std::to_string(E) +
                                  " experts but adapter_config.json says " + std::to_string(config_rank));
  const double* pattern_alpha = match_pattern(config_.alpha_pattern, entry.parameter);
  entry.scale = lora_scaling(pattern_alpha ? *pattern_alpha : config_.lora_alpha, entry.rank, config_.use_rslora);
  auto& list = stacked_[layer];
  for (const auto& other : list)
    for (const auto& [p, row] : other.parts)
      for (const auto& [q, row2] : entry.parts)
        if (p == q)
          fail(ErrorKind::bad_file, where + ": layer " + std::to_string(layer) + " " + projection_name(p) + " has LoRA twice, also in '" +
                                        other.key_a + "'");
  if (auto it = layers_.find(layer); it != layers_.end())
    for (const auto& [p, row] : entry.parts)
      for (const auto& per_expert : it->second[static_cast<int>(p)])
        if (!per_expert.key_a.empty())
          fail(ErrorKind::bad_file, where + ": layer " + std::to_string(layer) + " " + projection_name(p) +
                                        " has LoRA both per expert ('" + per_expert.key_a + "') and stacked");
  list.push_back(std::move(entry));
}

std::vector<int> PeftAdapter::layers() const {
  std::vector<int> out;
  for (const auto& [l, _] : layers_) out.push_back(l);
  for (const auto& [l, _] : stacked_)
    if (!layers_.count(l)) out.push_back(l);
  std::sort(out.begin(), out.end());
  return out;
}

const std::vector<PeftStackedEntry>& PeftAdapter::stacked_entries(int layer) const {
  static const std::vector<PeftStackedEntry> none;
  auto it = stacked_.find(layer);
  return it == stacked_.end() ? none : it->second;
}

const std::array<std::vector<PeftExpertEntry>, 3>* PeftAdapter::layer_entries(int layer) const {
  auto it = layers_.find(layer);
  return it == layers_.end() ? nullptr : &it->second;
}

std::string LoadedLora::key_a(Projection p, int e) const { return expand_expert_key_template(key_template_a[static_cast<int>(p)], e); }
std::string LoadedLora::key_b(Projection p, int e) const { return expand_expert_key_template(key_template_b[static_cast<int>(p)], e); }

namespace {

// The layer's stacked pairs into out.lora, expert by expert.
void load_stacked_entries(const PeftAdapter& adapter, const MoeShape& s, int layer, LoadedLora& out) {
  const int E = s.num_experts;
  for (const auto& entry : adapter.stacked_entries(layer)) {
    const auto& ta = adapter.file().get(entry.key_a);
    const auto& tb = adapter.file().get(entry.key_b);
    auto a = io::read_as_f32(adapter.file(), entry.key_a);
    auto b = io::read_as_f32(adapter.file(), entry.key_b);
    require_finite(a.data(), a.size(), adapter.file().path() + ": '" + entry.key_a + "'");
    require_finite(b.data(), b.size(), adapter.file().path() + ": '" + entry.key_b + "'");
    const int r = entry.rank;
    for (const auto& [p, first_row] : entry.parts) {
      auto& proj = out.lora[p];
      const int in = projection_in(s, p), o = projection_out(s, p);
      proj.allocate(E, r, in, o);
      for (int e = 0; e < E; ++e) {
        proj.present[e] = 1;
        proj.scale[e] = static_cast<float>(entry.scale);
        proj.expert_rank[e] = r;
        std::copy_n(a.data() + static_cast<std::size_t>(e) * r * in, static_cast<std::size_t>(r) * in, proj.a_of(e));
        float* bd = proj.b_of(e);
        for (int row = 0; row < o; ++row)
          for (int j = 0; j < r; ++j)
            bd[static_cast<std::size_t>(row) * r + j] =
                b[peft_stacked_b_index(static_cast<std::size_t>(first_row) + static_cast<std::size_t>(row) * entry.row_step, j, e, r, E)];
      }
      auto& keys = out.stacked[static_cast<int>(p)];
      keys.key_a = entry.key_a;
      keys.key_b = entry.key_b;
      keys.first_row = first_row;
      keys.row_step = entry.row_step;
      keys.b_rows = static_cast<int>(tb.shape[0]);
      keys.dtype_a = ta.dtype;
      keys.dtype_b = tb.dtype;
      out.dtype_a[static_cast<int>(p)].assign(E, ta.dtype);
      out.dtype_b[static_cast<int>(p)].assign(E, tb.dtype);
    }
  }
}

}  // namespace

std::vector<StackedLoraGrad> stacked_lora_grads(const LoadedLora& lora, const LayerLora& grads) {
  std::vector<StackedLoraGrad> out;
  auto find = [&](const std::string& key) -> StackedLoraGrad* {
    for (auto& g : out)
      if (g.key == key) return &g;
    return nullptr;
  };
  for (Projection p : kProjections) {
    const auto& keys = lora.stacked[static_cast<int>(p)];
    const auto& g = grads[p];
    if (keys.empty() || g.rank == 0) continue;
    const int E = static_cast<int>(g.present.size()), r = g.rank;
    const std::size_t b_cols = static_cast<std::size_t>(r) * E;
    StackedLoraGrad* ga = find(keys.key_a);
    if (!ga) {
      out.push_back({keys.key_a, {static_cast<std::int64_t>(b_cols), g.in}, std::vector<float>(b_cols * g.in, 0.0f)});
      ga = &out.back();
    }
    for (int e = 0; e < E; ++e)  // a shared A's gradient is the sum of its projections'
      for (std::size_t i = 0; i < static_cast<std::size_t>(r) * g.in; ++i) ga->values[static_cast<std::size_t>(e) * r * g.in + i] += g.a_of(e)[i];
    StackedLoraGrad* gb = find(keys.key_b);
    if (!gb) {
      out.push_back({keys.key_b, {keys.b_rows, static_cast<std::int64_t>(b_cols)},
                     std::vector<float>(static_cast<std::size_t>(keys.b_rows) * b_cols, 0.0f)});
      gb = &out.back();
    }
    for (int e = 0; e < E; ++e)
      for (int row = 0; row < g.out; ++row)
        for (int j = 0; j < r; ++j)
          gb->values[peft_stacked_b_index(static_cast<std::size_t>(keys.first_row) + static_cast<std::size_t>(row) * keys.row_step, j, e, r, E)] =
              g.b_of(e)[static_cast<std::size_t>(row) * r + j];
  }
  return out;
}

LoadedLora load_peft_layer(const PeftAdapter& adapter, const MoeShape& s, int layer) {
  LoadedLora out;
  out.warnings = adapter.warnings();
  out.adapter_config = adapter.config().json_text;
  load_stacked_entries(adapter, s, layer, out);
  const auto* entries = adapter.layer_entries(layer);
  if (!entries && !adapter.stacked_entries(layer).empty()) return out;
  if (!entries) {
    if (adapter.expert_keys() > 0)
      out.warnings.push_back(adapter.dir() + ": no LoRA for layer " + std::to_string(layer) + "; its experts run without LoRA");
    return out;
  }
  for (Projection p : kProjections) {
    const auto& list = (*entries)[static_cast<int>(p)];
    int max_rank = 0;
    for (const auto& e : list) max_rank = std::max(max_rank, e.rank);
    if (max_rank == 0) continue;
    auto& proj = out.lora[p];
    int in = projection_in(s, p), o = projection_out(s, p);
    proj.allocate(s.num_experts, max_rank, in, o);
    auto& dtype_a = out.dtype_a[static_cast<int>(p)];
    auto& dtype_b = out.dtype_b[static_cast<int>(p)];
    dtype_a.assign(s.num_experts, io::Dtype::F32);
    dtype_b.assign(s.num_experts, io::Dtype::F32);
    for (int e = 0; e < s.num_experts; ++e) {
      const auto& entry = list[e];
      if (entry.rank == 0) continue;
      dtype_a[e] = adapter.file().get(entry.key_a).dtype;
      dtype_b[e] = adapter.file().get(entry.key_b).dtype;
      proj.present[e] = 1;
      proj.scale[e] = static_cast<float>(entry.scale);
      proj.expert_rank[e] = entry.rank;
      auto a = io::read_as_f32(adapter.file(), entry.key_a);
      auto b = io::read_as_f32(adapter.file(), entry.key_b);
      require_finite(a.data(), a.size(), adapter.file().path() + ": '" + entry.key_a + "'");
      require_finite(b.data(), b.size(), adapter.file().path() + ": '" + entry.key_b + "'");
      std::copy(a.begin(), a.end(), proj.a_of(e));  // rows beyond entry.rank stay zero
      float* bd = proj.b_of(e);
      for (int r = 0; r < o; ++r)
        for (int c = 0; c < entry.rank; ++c) bd[static_cast<std::size_t>(r) * max_rank + c] = b[static_cast<std::size_t>(r) * entry.rank + c];
      if (out.key_template_a[static_cast<int>(p)].empty()) {
        out.key_template_a[static_cast<int>(p)] = expert_key_template(entry.key_a, e);
        out.key_template_b[static_cast<int>(p)] = expert_key_template(entry.key_b, e);
      }
    }
  }
  return out;
}

LoadedLora load_layer_lora(const std::string& adapter_path, const ModelConfig& model, int layer) {
  if (fs::is_directory(adapter_path)) return load_peft_layer(PeftAdapter::open(adapter_path, model), model.shape, layer);
  if (!fs::exists(adapter_path)) fail(ErrorKind::bad_file, adapter_path + ": no such adapter directory or file");
  return load_converted_layer(adapter_path, model, layer);
}

}  // namespace tilemoe
