// The format of quantized directories: names, metadata, quantization.json; and the spec of a
// checkpoint to quantize. The writer and the loader are in quantized_file_writer.cpp and
// quantized_file_loader.cpp.
#include "src/quant/quantized_file.hpp"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "src/model/checkpoint.hpp"
#include "src/model/tensor_names.hpp"
#include "src/quant/checkpoint_fingerprint.hpp"
#include "src/quant/quantized_file_format.hpp"
#include "tilemoe/error.hpp"

namespace tilemoe::quant {
namespace {

using nlohmann::json;

std::vector<std::string> split_dots(const std::string& s) {
  std::vector<std::string> parts;
  std::stringstream ss(s);
  std::string part;
  while (std::getline(ss, part, '.')) parts.push_back(part);
  if (!s.empty() && s.back() == '.') parts.emplace_back();
  return parts;
}

void replace_first(std::string& s, const std::string& what, const std::string& with) {
  auto pos = s.find(what);
  if (pos != std::string::npos) s.replace(pos, what.size(), with);
}

const char* projection_key(Projection p) { return projection_name(p); }  // "gate", "up", "down"

std::string text_of(const std::vector<int>& v) {
  std::string s;
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s;
}

// quantization.json's fields, each error naming the file and the field.
class IndexReader {
 public:
  IndexReader(const json& j, const std::string& path) : j_(j), path_(path) {}

  [[noreturn]] void bad(const std::string& field, const std::string& what) const {
    fail(ErrorKind::bad_file, path_ + ": '" + field + "' " + what);
  }
  const json& member(const json& obj, const std::string& key, const std::string& field) const {
    auto it = obj.find(key);
    if (it == obj.end()) bad(field, "is missing");
    return *it;
  }
  int integer(const json& obj, const std::string& key, const std::string& field, int lo, int hi) const {
    const json& v = member(obj, key, field);
    if (!v.is_number_integer()) bad(field, "is not an integer");
    const auto x = v.get<long long>();
    if (x < lo || x > hi) bad(field, "is " + std::to_string(x) + ", outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    return static_cast<int>(x);
  }
  std::string string(const json& obj, const std::string& key, const std::string& field) const {
    const json& v = member(obj, key, field);
    if (!v.is_string()) bad(field, "is not a string");
    return v.get<std::string>();
  }
  const json& object(const json& obj, const std::string& key, const std::string& field) const {
    const json& v = member(obj, key, field);
    if (!v.is_object()) bad(field, "is not an object");
    return v;
  }
  std::vector<int> ascending_layers(const json& obj, const std::string& key, const std::string& field) const {
    const json& v = member(obj, key, field);
    if (!v.is_array()) bad(field, "is not an array");
    std::vector<int> out;
    for (const auto& x : v) {
      if (!x.is_number_integer() || x.get<long long>() < 0 || x.get<long long>() > (1 << 20)) bad(field, "holds something other than a layer index");
      out.push_back(x.get<int>());
      if (out.size() > 1 && out[out.size() - 2] >= out.back()) bad(field, "is not strictly ascending");
    }
    return out;
  }
  const json& root() const { return j_; }

 private:
  const json& j_;
  const std::string& path_;
};

bool plain_file_name(const std::string& f) {
  return !f.empty() && f.find('/') == std::string::npos && f != "." && f != "..";
}

}  // namespace

std::string expert_name_template(const std::string& weight_name, int layer, int expert) {
  auto parts = split_dots(weight_name);
  const std::string l = std::to_string(layer), e = std::to_string(expert);
  std::size_t i = 0;
  while (i + 1 < parts.size() && !(parts[i] == "layers" && parts[i + 1] == l)) ++i;
  std::size_t j = i + 2;
  while (j + 1 < parts.size() && !(parts[j] == "experts" && parts[j + 1] == e)) ++j;
  if (i + 1 >= parts.size() || j + 1 >= parts.size())
    fail(ErrorKind::unsupported, "'" + weight_name + "': expected 'layers." + l + "' and then 'experts." + e + "' in the name");
  parts[i + 1] = "{L}";
  parts[j + 1] = "{E}";
  if (parts.back() == "weight") parts.pop_back();
  std::string out;
  for (std::size_t k = 0; k < parts.size(); ++k) out += (k ? "." : "") + parts[k];
  return out;
}

std::string stacked_expert_name_template(const std::string& stacked_name, int layer, Projection p) {
  const auto parsed = parse_stacked_expert_tensor_name(stacked_name);
  if (!parsed || parsed->layer != layer)
    fail(ErrorKind::unsupported, "'" + stacked_name + "': not a stack of layer " + std::to_string(layer) + "'s experts");
  auto parts = split_dots(stacked_name);
  const std::string l = std::to_string(layer);
  std::size_t i = 0;
  while (i + 1 < parts.size() && !(parts[i] == "layers" && parts[i + 1] == l)) ++i;
  std::size_t j = i + 2;  // the projection token, after the module that holds the stack
  while (j < parts.size() && parts[j] != parsed->projection_token) ++j;
  parts[i + 1] = "{L}";
  const bool under_experts = j > 0 && parts[j - 1] == "experts";
  parts.resize(j);
  // A stack held by the MoE block itself (GraniteMoE's input_linear / output_linear) is named as
  // a module "experts" of that block.
  if (!under_experts) parts.push_back("experts");
  parts.push_back("{E}");
  // Each expert's projection under the per-expert name transformers v4 gave it: a gate_up stack
  // holds two; GraniteMoE's output_linear is down_proj; other stacks keep their token.
  std::string token = parsed->projection_token;
  if (parsed->kind == StackedExperts::gate_up) token = p == Projection::gate ? "gate_proj" : "up_proj";
  else if (!under_experts) token = "down_proj";
  parts.push_back(token);
  std::string out;
  for (std::size_t k = 0; k < parts.size(); ++k) out += (k ? "." : "") + parts[k];
  return out;
}

std::string expert_tensor_base(const std::string& name_template, int layer, int expert) {
  std::string s = name_template;
  replace_first(s, "{L}", std::to_string(layer));
  replace_first(s, "{E}", std::to_string(expert));
  return s;
}

namespace format {

std::string layer_file_name(int layer, int node, int nodes) {
  std::string base = "layer_" + std::to_string(layer);
  return nodes == 1 ? base + ".safetensors" : base + ".node_" + std::to_string(node) + ".safetensors";
}

std::map<std::string, std::string> file_metadata(const QuantizedModelInfo& info, int layer, int node) {
  const IntermediateSlice s = info.slices[node];
  return {{"format", kQuantizedFormat},
          {"format_version", std::to_string(kQuantizedFormatVersion)},
          {"weight_type", weight_type_name(info.type)},
          {"group_size", std::to_string(info.group)},
          {"layer", std::to_string(layer)},
          {"node", std::to_string(node)},
          {"numa_nodes", std::to_string(info.numa_nodes())},
          {"slice_begin", std::to_string(s.begin)},
          {"slice_end", std::to_string(s.end)},
          {"hidden", std::to_string(info.shape.hidden)},
          {"intermediate", std::to_string(info.shape.intermediate)},
          {"num_experts", std::to_string(info.shape.num_experts)},
          {"source_hash", info.source_hash}};
}

io::Dtype code_dtype(WeightType type) { return is_four_bit_weight_type(type) ? io::Dtype::U8 : io::Dtype::I8; }

MoeShape slice_shape(const MoeShape& full, IntermediateSlice s) {
  MoeShape out = full;
  out.intermediate = s.width();
  return out;
}

std::vector<std::int64_t> qweight_shape(WeightType type, const MoeShape& s, Projection p) {
  const std::int64_t n = projection_out(s, p), k = projection_in(s, p);
  return {n, is_four_bit_weight_type(type) ? (k + 1) / 2 : k};
}

std::vector<std::int64_t> scales_shape(WeightType type, int group, const MoeShape& s, Projection p) {
  const std::int64_t n = projection_out(s, p), k = projection_in(s, p);
  if (type == WeightType::int8) return {n};
  return {n, (k + group - 1) / group};
}

void check_spec(const QuantizedModelSpec& spec) {
  if (spec.type != WeightType::int8 && spec.type != WeightType::int4 && spec.type != WeightType::mxfp4)
    fail(ErrorKind::invalid_argument, std::string("quantized weights: type ") + weight_type_name(spec.type) + " is not int8, int4 or mxfp4");
  if (spec.type == WeightType::mxfp4 && spec.group != kMxfp4Group)
    fail(ErrorKind::invalid_argument, "quantized weights: mxfp4 group size " + std::to_string(spec.group) + " is not 32");
  if (spec.type == WeightType::int4 && !valid_int4_group(spec.group))
    fail(ErrorKind::invalid_argument, "quantized weights: int4 group size " + std::to_string(spec.group) + " is not 32, 64 or 128");
  numa_slices(spec.shape.intermediate, spec.numa_nodes);  // throws for a count that does not fit
  if (spec.layers.empty()) fail(ErrorKind::invalid_argument, "quantized weights: no layers");
  for (std::size_t i = 1; i < spec.layers.size(); ++i)
    if (spec.layers[i] <= spec.layers[i - 1])
      fail(ErrorKind::invalid_argument, "quantized weights: layers " + text_of(spec.layers) + " are not listed once each, ascending");
}

std::string index_text(const QuantizedModelInfo& info) {
  json j;
  j["format"] = kQuantizedFormat;
  j["format_version"] = kQuantizedFormatVersion;
  j["weight_type"] = weight_type_name(info.type);
  j["group_size"] = info.group;
  j["model_type"] = info.model_type;
  j["shape"] = {{"hidden", info.shape.hidden},
                {"intermediate", info.shape.intermediate},
                {"num_experts", info.shape.num_experts},
                {"top_k", info.shape.top_k}};
  j["layers"] = info.layers;
  j["numa_nodes"] = info.numa_nodes();
  j["slices"] = json::array();
  for (const auto& s : info.slices) j["slices"].push_back({s.begin, s.end});
  j["files"] = json::object();
  for (const auto& [layer, names] : info.files) j["files"][std::to_string(layer)] = names;
  if (!info.router_file.empty()) j["router"] = {{"file", info.router_file}, {"layers", info.router_layers}};
  for (Projection p : kProjections) j["tensor_names"][projection_key(p)] = info.name_templates[static_cast<int>(p)];
  j["source"] = {{"hash", info.source_hash}, {"hash_covers", kHashCovers}};
  return j.dump(2) + "\n";
}

QuantizedModelInfo parse_index(const std::string& text, const std::string& path) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    fail(ErrorKind::bad_file, path + ": not valid JSON (" + e.what() + ")");
  }
  if (!j.is_object()) fail(ErrorKind::bad_file, path + ": not a JSON object");
  IndexReader r(j, path);
  const std::string fmt = r.string(j, "format", "format");
  if (fmt != kQuantizedFormat) r.bad("format", "is '" + fmt + "', expected '" + kQuantizedFormat + "'");
  const int version = r.integer(j, "format_version", "format_version", 0, 1 << 20);
  if (version > kQuantizedFormatVersion)
    r.bad("format_version", "is " + std::to_string(version) + ", newer than this build reads (" +
                                std::to_string(kQuantizedFormatVersion) + "): update tilemoe or quantize again");
  if (version != kQuantizedFormatVersion) r.bad("format_version", "is " + std::to_string(version) + ", not a version that was ever written");

  QuantizedModelInfo info;
  const std::string type = r.string(j, "weight_type", "weight_type");
  if (type == "int8") info.type = WeightType::int8;
  else if (type == "int4") info.type = WeightType::int4;
  else if (type == "mxfp4") info.type = WeightType::mxfp4;
  else r.bad("weight_type", "is '" + type + "', expected int8, int4 or mxfp4");
  info.group = r.integer(j, "group_size", "group_size", 0, 1 << 20);
  if (info.type == WeightType::int8 && info.group != 0) r.bad("group_size", "is " + std::to_string(info.group) + "; int8 has none (0)");
  if (info.type == WeightType::int4 && !valid_int4_group(info.group)) r.bad("group_size", "is " + std::to_string(info.group) + ", not 32, 64 or 128");
  if (info.type == WeightType::mxfp4 && info.group != kMxfp4Group) r.bad("group_size", "is " + std::to_string(info.group) + "; mxfp4's is 32");
  info.model_type = r.string(j, "model_type", "model_type");

  const json& shape = r.object(j, "shape", "shape");
  info.shape.hidden = r.integer(shape, "hidden", "shape.hidden", 1, 1 << 24);
  info.shape.intermediate = r.integer(shape, "intermediate", "shape.intermediate", 1, 1 << 24);
  info.shape.num_experts = r.integer(shape, "num_experts", "shape.num_experts", 1, 1 << 20);
  info.shape.top_k = r.integer(shape, "top_k", "shape.top_k", 0, info.shape.num_experts);

  info.layers = r.ascending_layers(j, "layers", "layers");
  if (info.layers.empty()) r.bad("layers", "is empty");
  const int nodes = r.integer(j, "numa_nodes", "numa_nodes", 1, 1024);
  const json& slices = r.member(j, "slices", "slices");
  if (!slices.is_array() || static_cast<int>(slices.size()) != nodes) r.bad("slices", "is not an array of numa_nodes (" + std::to_string(nodes) + ") ranges");
  int expected_begin = 0;
  for (std::size_t n = 0; n < slices.size(); ++n) {
    const json& s = slices[n];
    const std::string field = "slices[" + std::to_string(n) + "]";
    if (!s.is_array() || s.size() != 2 || !s[0].is_number_integer() || !s[1].is_number_integer() || s[0].get<long long>() < 0 ||
        s[1].get<long long>() > info.shape.intermediate)
      r.bad(field, "is not [begin, end] within intermediate " + std::to_string(info.shape.intermediate));
    IntermediateSlice sl{s[0].get<int>(), s[1].get<int>()};
    if (sl.begin != expected_begin || sl.end <= sl.begin || sl.end > info.shape.intermediate || sl.begin % kSliceAlign != 0)
      r.bad(field, "is [" + std::to_string(sl.begin) + ", " + std::to_string(sl.end) + "); slices must be non-empty, start at " +
                       std::to_string(expected_begin) + " (multiples of " + std::to_string(kSliceAlign) + ") and stay within intermediate " +
                       std::to_string(info.shape.intermediate));
    info.slices.push_back(sl);
    expected_begin = sl.end;
  }
  if (expected_begin != info.shape.intermediate)
    r.bad("slices", "end at " + std::to_string(expected_begin) + ", not at intermediate " + std::to_string(info.shape.intermediate));

  const json& files = r.object(j, "files", "files");
  for (int layer : info.layers) {
    const std::string field = "files." + std::to_string(layer);
    const json& list = r.member(files, std::to_string(layer), field);
    if (!list.is_array() || static_cast<int>(list.size()) != nodes) r.bad(field, "is not a list of numa_nodes (" + std::to_string(nodes) + ") file names");
    auto& names = info.files[layer];
    for (const auto& f : list) {
      if (!f.is_string() || !plain_file_name(f.get<std::string>())) r.bad(field, "holds something other than a file name in this directory");
      names.push_back(f.get<std::string>());
    }
  }
  if (files.size() != info.layers.size()) r.bad("files", "lists layers that 'layers' does not");

  if (j.contains("router")) {
    const json& router = r.object(j, "router", "router");
    info.router_file = r.string(router, "file", "router.file");
    if (!plain_file_name(info.router_file)) r.bad("router.file", "is not a file name in this directory");
    info.router_layers = r.ascending_layers(router, "layers", "router.layers");
  }
  const json& names = r.object(j, "tensor_names", "tensor_names");
  for (Projection p : kProjections) {
    const std::string field = std::string("tensor_names.") + projection_key(p);
    std::string t = r.string(names, projection_key(p), field);
    if (t.find("{L}") == std::string::npos || t.find("{E}") == std::string::npos) r.bad(field, "is '" + t + "', which lacks {L} or {E}");
    info.name_templates[static_cast<int>(p)] = std::move(t);
  }
  info.source_hash = r.string(r.object(j, "source", "source"), "hash", "source.hash");
  return info;
}

}  // namespace format

QuantizedModelInfo read_quantized_info(const std::string& dir) {
  const std::string path = dir + "/" + kQuantizedIndexFile;
  std::ifstream in(path, std::ios::binary);
  if (!in)
    fail(ErrorKind::bad_file, path + ": cannot open (is this a directory written by `tilemoe quantize`? one without " +
                                  kQuantizedIndexFile + " is an interrupted run)");
  std::stringstream ss;
  ss << in.rdbuf();
  return format::parse_index(ss.str(), path);
}

QuantizedModelSpec spec_for_checkpoint(const Checkpoint& ck, WeightType type, int group, int numa_nodes, std::vector<int> layers) {
  const ModelConfig& cfg = ck.config();
  if (layers.empty()) fail(ErrorKind::invalid_argument, ck.dir() + ": no layers to quantize");
  for (int layer : layers)
    if (!cfg.is_moe_layer(layer))
      fail(ErrorKind::invalid_argument, ck.dir() + ": layer " + std::to_string(layer) + " is not a MoE layer (MoE layers: " +
                                            cfg.moe_layers_string() + ")");
  QuantizedModelSpec spec;
  spec.type = type;
  spec.group = type == WeightType::int4 ? group : type == WeightType::mxfp4 ? kMxfp4Group : 0;
  spec.numa_nodes = numa_nodes;
  spec.layers = layers;
  spec.shape = cfg.shape;
  spec.model_type = cfg.model_type;
  format::check_spec(spec);  // before hashing and the name checks, which take a while on large checkpoints
  spec.source_hash = checkpoint_fingerprint(ck);
  {
    std::ifstream in(ck.dir() + "/config.json", std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    spec.config_json = ss.str();
  }
  // Stacked experts (transformers v5) get per-expert names in the quantized files.
  // gpt-oss's MXFP4 stacks ("..._blocks") are named as the stacks they dequantize to.
  auto template_of = [](const ExpertTensorRef& ref, int layer, int expert, Projection p) {
    if (!ref.stacked()) return expert_name_template(ref.name, layer, expert);
    constexpr std::string_view kBlocks = "_blocks";
    const bool mxfp4 = !ref.scales.empty() && ref.name.size() > kBlocks.size() &&
                       ref.name.compare(ref.name.size() - kBlocks.size(), kBlocks.size(), kBlocks) == 0;
    return stacked_expert_name_template(mxfp4 ? ref.name.substr(0, ref.name.size() - kBlocks.size()) : ref.name, layer, p);
  };
  const auto first = ck.expert_tensors(layers.front());
  for (Projection p : kProjections)
    spec.name_templates[static_cast<int>(p)] = template_of(first[static_cast<int>(p)][0], layers.front(), 0, p);
  // One naming for every layer, so that quantization.json's templates name every tensor.
  for (int layer : layers) {
    const auto refs = layer == layers.front() ? first : ck.expert_tensors(layer);
    for (Projection p : kProjections)
      for (int e = 0; e < cfg.shape.num_experts; ++e) {
        const ExpertTensorRef& ref = refs[static_cast<int>(p)][e];
        if (template_of(ref, layer, e, p) != spec.name_templates[static_cast<int>(p)])
          fail(ErrorKind::unsupported, ck.dir() + ": layer " + std::to_string(layer) + " expert " + std::to_string(e) + " " +
                                           projection_name(p) + " is stored as '" + ref.name + "', not as '" +
                                           expert_tensor_base(spec.name_templates[static_cast<int>(p)], layer, e) +
                                           ".weight' like layer " + std::to_string(layers.front()) +
                                           "'s experts; quantize needs one naming throughout");
      }
  }
  return spec;
}

}  // namespace tilemoe::quant
