#include "src/lora/lora_file.hpp"

#include <array>
#include <cstdint>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "src/io/safetensors_writer.hpp"
#include "src/model/finite_check.hpp"
#include "src/model/tensor_names.hpp"
#include "tilemoe/error.hpp"

namespace tilemoe {
namespace {

// The source byte span that one stacked tensor gathers from (its experts' A or B tensors).
void prefetch_sources(const io::SafetensorsFile& src, const std::vector<PeftExpertEntry>& list, bool a) {
  std::size_t lo = SIZE_MAX, hi = 0;
  for (const auto& e : list) {
    if (e.rank == 0) continue;
    const auto& t = src.get(a ? e.key_a : e.key_b);
    lo = std::min(lo, t.offset);
    hi = std::max(hi, t.offset + t.nbytes);
  }
  if (lo < hi) src.prefetch(lo, hi - lo);
}

std::string tensor_key(int layer, Projection p, const char* what) {
  return "layer_" + std::to_string(layer) + "." + projection_name(p) + "_lora_" + what;
}

std::string meta_key(const char* kind, int layer, Projection p, const char* factor) {
  return std::string(kind) + ".layer_" + std::to_string(layer) + "." + projection_name(p) + "." + factor;
}

int meta_int(const io::SafetensorsFile& f, const std::string& key) {
  auto it = f.metadata().find(key);
  if (it == f.metadata().end()) fail(ErrorKind::bad_file, f.path() + ": metadata '" + key + "' is missing");
  try {
    return std::stoi(it->second);
  } catch (const std::exception&) {
    fail(ErrorKind::bad_file, f.path() + ": metadata '" + key + "' is not an integer ('" + it->second + "')");
  }
}

// One name when every covered expert shares it (PEFT saves one dtype), else one per expert.
std::string dtype_list(const io::SafetensorsFile& src, const std::vector<PeftExpertEntry>& list, bool a) {
  std::vector<std::string> names;
  std::set<std::string> distinct;
  for (const auto& e : list) {
    names.push_back(e.rank == 0 ? "" : io::dtype_name(src.get(a ? e.key_a : e.key_b).dtype));
    if (e.rank > 0) distinct.insert(names.back());
  }
  if (distinct.size() == 1) return *distinct.begin();
  std::string out;
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (i) out += ',';
    out += names[i];
  }
  return out;
}

std::vector<io::Dtype> parse_dtype_list(const io::SafetensorsFile& f, const std::string& key, int num_experts, io::Dtype stored) {
  auto it = f.metadata().find(key);
  if (it == f.metadata().end()) return std::vector<io::Dtype>(num_experts, stored);
  std::vector<std::string> names;
  std::size_t start = 0;
  for (std::size_t comma; (comma = it->second.find(',', start)) != std::string::npos; start = comma + 1)
    names.push_back(it->second.substr(start, comma - start));
  names.push_back(it->second.substr(start));
  if (names.size() == 1) names.assign(num_experts, names[0]);
  if (static_cast<int>(names.size()) != num_experts)
    fail(ErrorKind::bad_file, f.path() + ": metadata '" + key + "' lists " + std::to_string(names.size()) + " dtypes for " +
                                  std::to_string(num_experts) + " experts");
  std::vector<io::Dtype> out(num_experts, stored);
  for (int e = 0; e < num_experts; ++e) {
    if (names[e].empty()) continue;
    auto d = io::parse_dtype(names[e]);
    if (!d || (*d != io::Dtype::BF16 && *d != io::Dtype::F16 && *d != io::Dtype::F32))
      fail(ErrorKind::bad_file, f.path() + ": metadata '" + key + "' has dtype '" + names[e] + "', expected BF16, F16 or F32");
    out[e] = *d;
  }
  return out;
}

// Streamed tensor fills report here; `total` is final before the writer calls the first fill.
struct ProgressCounter {
  std::size_t done = 0, total = 0;
  ProgressFn fn;
  void add(std::size_t n) {
    done += n;
    if (fn) fn(done, total);
  }
};

// One projection of a stacked PEFT pair (see PeftStackedEntry) as the file stacks every LoRA:
// A [E, r, in] is the stacked A as it is ([r*E, in] holds expert e's rows at e*r), B [E, out, r]
// gathered from the stacked B's columns j*E + e; where it came from goes in the metadata, for
// load_converted_layer and export-peft.
void add_stacked_projection(io::SafetensorsWriter& w, const io::SafetensorsFile& src, const MoeShape& s, int layer, Projection p,
                            int first_row, const PeftStackedEntry& entry, io::Dtype out_dtype, std::shared_ptr<ProgressCounter> counter) {
  const int step = entry.row_step;
  const int E = s.num_experts, r = entry.rank, in = projection_in(s, p), out = projection_out(s, p);
  const std::size_t esize = io::dtype_size(out_dtype);
  const io::TensorInfo& ta = src.get(entry.key_a);
  const io::TensorInfo& tb = src.get(entry.key_b);
  nlohmann::json where = {{"a", entry.key_a}, {"b", entry.key_b}, {"first_row", first_row}, {"b_rows", tb.shape[0]}};
  if (step != 1) where["row_step"] = step;
  w.set_metadata(meta_key("peft_stacked", layer, p, "ab"), where.dump());
  w.set_metadata(meta_key("peft_dtype", layer, p, "a"), io::dtype_name(ta.dtype));
  w.set_metadata(meta_key("peft_dtype", layer, p, "b"), io::dtype_name(tb.dtype));
  counter->total += static_cast<std::size_t>(E) * r * (in + out) * esize;
  w.add_streamed(tensor_key(layer, p, "a"), out_dtype, {E, r, in}, [&src, &ta, out_dtype, counter](std::byte* dst, std::size_t n) {
    if (ta.dtype == out_dtype) std::memcpy(dst, src.data(ta), n);
    else io::convert_to_f32(ta.dtype, src.data(ta), static_cast<std::size_t>(ta.numel()), reinterpret_cast<float*>(dst));
    counter->add(n);
  });
  w.add_streamed(tensor_key(layer, p, "b"), out_dtype, {E, out, r},
                 [&src, &tb, E, r, out, first_row, step, esize, out_dtype, counter](std::byte* dst, std::size_t n) {
                   const std::size_t src_size = io::dtype_size(tb.dtype);
                   const std::byte* b = src.data(tb);
                   for (int e = 0; e < E; ++e)
                     for (int o = 0; o < out; ++o)
                       for (int j = 0; j < r; ++j) {
                         const std::byte* from = b + peft_stacked_b_index(static_cast<std::size_t>(first_row) + static_cast<std::size_t>(o) * step, j, e, r, E) * src_size;
                         std::byte* to = dst + ((static_cast<std::size_t>(e) * out + o) * r + j) * esize;
                         if (tb.dtype == out_dtype) std::memcpy(to, from, esize);
                         else io::convert_to_f32(tb.dtype, from, 1, reinterpret_cast<float*>(to));
                       }
                   counter->add(n);
                 });
  const std::vector<std::uint8_t> mask(E, 1);
  const std::vector<std::int32_t> ranks(E, r);
  w.add_streamed(tensor_key(layer, p, "mask"), io::Dtype::U8, {E}, [mask](std::byte* dst, std::size_t n) { std::memcpy(dst, mask.data(), n); });
  w.add_f32(tensor_key(layer, p, "scale"), {E}, std::vector<float>(E, static_cast<float>(entry.scale)));
  w.add_streamed(tensor_key(layer, p, "rank"), io::Dtype::I32, {E}, [ranks](std::byte* dst, std::size_t n) { std::memcpy(dst, ranks.data(), n); });
}

}  // namespace

ConvertStats convert_peft_to_lora_file(const PeftAdapter& adapter, const ModelConfig& model, const std::string& output,
                                       const ProgressFn& progress) {
  const MoeShape& s = model.shape;
  const io::SafetensorsFile& src = adapter.file();
  // Keep bf16 adapters in bf16 (half the bytes); anything else becomes f32, which loses nothing.
  bool all_bf16 = true;
  for (int layer : adapter.layers()) {
    if (const auto* entries = adapter.layer_entries(layer))
      for (const auto& list : *entries)
        for (const auto& e : list)
          if (e.rank > 0 && (src.get(e.key_a).dtype != io::Dtype::BF16 || src.get(e.key_b).dtype != io::Dtype::BF16)) all_bf16 = false;
    for (const auto& e : adapter.stacked_entries(layer))
      if (src.get(e.key_a).dtype != io::Dtype::BF16 || src.get(e.key_b).dtype != io::Dtype::BF16) all_bf16 = false;
  }
  io::Dtype out_dtype = all_bf16 ? io::Dtype::BF16 : io::Dtype::F32;
  std::size_t esize = io::dtype_size(out_dtype);

  io::SafetensorsWriter w;
  ConvertStats stats;
  auto counter = std::make_shared<ProgressCounter>();
  counter->fn = progress;
  int max_rank = 0;
  std::string layer_list;
  for (int layer : adapter.layers()) {
    ++stats.layers;
    if (!layer_list.empty()) layer_list += ',';
    layer_list += std::to_string(layer);
    for (const auto& entry : adapter.stacked_entries(layer)) {
      max_rank = std::max(max_rank, entry.rank);
      for (const auto& [p, first_row] : entry.parts) {
        add_stacked_projection(w, src, s, layer, p, first_row, entry, out_dtype, counter);
        stats.expert_tensors += 2;
      }
    }
    static const std::array<std::vector<PeftExpertEntry>, 3> kNone;
    const auto& entries = adapter.layer_entries(layer) ? *adapter.layer_entries(layer) : kNone;
    for (Projection p : kProjections) {
      const auto& list = entries[static_cast<int>(p)];
      int rank = 0;
      for (const auto& e : list) rank = std::max(rank, e.rank);
      if (rank == 0) continue;
      max_rank = std::max(max_rank, rank);
      int in = projection_in(s, p), out = projection_out(s, p);
      std::vector<std::uint8_t> mask(s.num_experts, 0);
      std::vector<float> scale(s.num_experts, 0.0f);
      std::vector<std::int32_t> ranks(s.num_experts, 0);
      std::string template_a, template_b;
      for (int e = 0; e < s.num_experts; ++e) {
        if (list[e].rank == 0) continue;
        mask[e] = 1;
        scale[e] = static_cast<float>(list[e].scale);
        ranks[e] = list[e].rank;
        stats.expert_tensors += 2;
        if (template_a.empty()) {
          template_a = expert_key_template(list[e].key_a, e);
          template_b = expert_key_template(list[e].key_b, e);
        }
        // One template per layer and projection names every expert at export: refuse what it cannot name.
        for (const auto& [key, tmpl] : {std::pair{&list[e].key_a, &template_a}, std::pair{&list[e].key_b, &template_b}})
          if (expand_expert_key_template(*tmpl, e) != *key)
            fail(ErrorKind::unsupported, src.path() + ": '" + *key + "' is not named like the layer's other experts ('" + *tmpl +
                                             "'), so an export could not give it back its name");
      }
      w.set_metadata(meta_key("peft_key", layer, p, "a"), template_a);
      w.set_metadata(meta_key("peft_key", layer, p, "b"), template_b);
      w.set_metadata(meta_key("peft_dtype", layer, p, "a"), dtype_list(src, list, true));
      w.set_metadata(meta_key("peft_dtype", layer, p, "b"), dtype_list(src, list, false));
      std::size_t a_bytes = static_cast<std::size_t>(s.num_experts) * rank * in * esize;
      std::size_t b_bytes = static_cast<std::size_t>(s.num_experts) * out * rank * esize;
      counter->total += a_bytes + b_bytes;
      // A: each expert's [r_e, in] block is contiguous in both files; rows past r_e are zero.
      w.add_streamed(tensor_key(layer, p, "a"), out_dtype, {s.num_experts, rank, in},
                     [&src, &list, rank, in, esize, out_dtype, counter](std::byte* dst, std::size_t n) {
                       prefetch_sources(src, list, true);
                       std::memset(dst, 0, n);
                       std::size_t per_expert = static_cast<std::size_t>(rank) * in * esize;
                       for (std::size_t e = 0; e < list.size(); ++e) {
                         if (list[e].rank == 0) continue;
                         const auto& t = src.get(list[e].key_a);
                         std::byte* d = dst + e * per_expert;
                         if (t.dtype == out_dtype) std::memcpy(d, src.data(t), t.nbytes);
                         else io::convert_to_f32(t.dtype, src.data(t), static_cast<std::size_t>(t.numel()), reinterpret_cast<float*>(d));
                       }
                       counter->add(n);
                     });
      // B: [out, r_e] rows are re-strided to [out, r].
      w.add_streamed(tensor_key(layer, p, "b"), out_dtype, {s.num_experts, out, rank},
                     [&src, &list, rank, out, esize, out_dtype, counter](std::byte* dst, std::size_t n) {
                       prefetch_sources(src, list, false);
                       std::memset(dst, 0, n);
                       std::size_t per_expert = static_cast<std::size_t>(out) * rank * esize;
                       for (std::size_t e = 0; e < list.size(); ++e) {
                         int re = list[e].rank;
                         if (re == 0) continue;
                         const auto& t = src.get(list[e].key_b);
                         const std::byte* s0 = src.data(t);
                         std::size_t src_row = static_cast<std::size_t>(re) * io::dtype_size(t.dtype);
                         for (int r = 0; r < out; ++r) {
                           std::byte* d = dst + e * per_expert + static_cast<std::size_t>(r) * rank * esize;
                           if (t.dtype == out_dtype) std::memcpy(d, s0 + r * src_row, src_row);
                           else io::convert_to_f32(t.dtype, s0 + r * src_row, re, reinterpret_cast<float*>(d));
                         }
                       }
                       counter->add(n);
                     });
      w.add_streamed(tensor_key(layer, p, "mask"), io::Dtype::U8, {s.num_experts},
                     [mask](std::byte* dst, std::size_t n) { std::memcpy(dst, mask.data(), n); });
      w.add_f32(tensor_key(layer, p, "scale"), {s.num_experts}, scale);
      w.add_streamed(tensor_key(layer, p, "rank"), io::Dtype::I32, {s.num_experts},
                     [ranks](std::byte* dst, std::size_t n) { std::memcpy(dst, ranks.data(), n); });
    }
  }
  // Everything else travels along untouched, so that an export gives back the whole adapter.
  for (const std::string& key : adapter.other_keys()) {
    const io::TensorInfo& t = src.get(key);
    counter->total += t.nbytes;
    w.add_streamed(kVerbatimPrefix + key, t.dtype, t.shape, [&src, &t, counter](std::byte* dst, std::size_t n) {
      std::memcpy(dst, src.data(t), n);
      counter->add(n);
    });
  }
  stats.other_keys = static_cast<int>(adapter.other_keys().size());
  const PeftConfig& c = adapter.config();
  w.set_metadata("format", kLoraFileFormat);
  w.set_metadata("format_version", kLoraFileVersion);
  w.set_metadata("lora_rank", std::to_string(max_rank));
  w.set_metadata("lora_alpha", std::to_string(c.lora_alpha));
  w.set_metadata("use_rslora", c.use_rslora ? "true" : "false");
  w.set_metadata("scaling", std::to_string(lora_scaling(c.lora_alpha, c.r, c.use_rslora)));
  w.set_metadata("num_experts", std::to_string(s.num_experts));
  w.set_metadata("num_layers", std::to_string(model.num_layers));
  w.set_metadata("moe_layers", layer_list);
  w.set_metadata("hidden_size", std::to_string(s.hidden));
  w.set_metadata("intermediate_size", std::to_string(s.intermediate));
  w.set_metadata("adapter_config", c.json_text);
  w.set_metadata(kPeftFileMetadataKey, nlohmann::json(src.metadata()).dump());
  w.write(output);
  stats.bytes_written = counter->total;
  return stats;
}

void require_lora_file(const io::SafetensorsFile& f, const std::string& hint) {
  auto fmt = f.metadata().find("format");
  if (fmt == f.metadata().end() || fmt->second != kLoraFileFormat)
    fail(ErrorKind::bad_file, f.path() + ": not a tilemoe LoRA file (metadata 'format' is not '" + kLoraFileFormat + "'); " + hint);
}

std::vector<int> converted_layers(const io::SafetensorsFile& f) {
  std::set<int> layers;
  for (const auto& t : f.tensors()) {
    if (t.name.rfind("layer_", 0) != 0) continue;
    std::size_t dot = t.name.find('.');
    if (dot == std::string::npos || dot == 6 || dot > 15 || t.name.find_first_not_of("0123456789", 6) != dot) continue;
    std::string rest = t.name.substr(dot + 1);
    for (Projection p : kProjections)
      if (rest == std::string(projection_name(p)) + "_lora_a") layers.insert(std::stoi(t.name.substr(6, dot - 6)));
  }
  return {layers.begin(), layers.end()};
}

std::optional<ConvertedProjection> converted_projection(const io::SafetensorsFile& f, int layer, Projection p) {
  const io::TensorInfo* a = f.find(tensor_key(layer, p, "a"));
  if (!a) return std::nullopt;
  const std::string& path = f.path();
  if (a->shape.size() != 3 || a->shape[0] <= 0 || a->shape[1] <= 0 || a->shape[2] <= 0)
    fail(ErrorKind::bad_file, path + ": '" + a->name + "' has shape " + io::shape_string(a->shape) + ", expected [experts, r, in]");
  ConvertedProjection c;
  c.a = a;
  c.num_experts = static_cast<int>(a->shape[0]);
  c.rank = static_cast<int>(a->shape[1]);
  c.in = static_cast<int>(a->shape[2]);
  c.b = &f.get(tensor_key(layer, p, "b"));
  if (c.b->shape.size() != 3 || c.b->shape[0] != c.num_experts || c.b->shape[1] <= 0 || c.b->shape[2] != c.rank)
    fail(ErrorKind::bad_file, path + ": '" + c.b->name + "' has shape " + io::shape_string(c.b->shape) + ", expected [" +
                                  std::to_string(c.num_experts) + ", out, " + std::to_string(c.rank) + "]");
  c.out = static_cast<int>(c.b->shape[1]);
  std::vector<std::int64_t> e_shape{c.num_experts};
  auto mask = io::read_as_i64(f, tensor_key(layer, p, "mask"), e_shape);
  auto ranks = io::read_as_i64(f, tensor_key(layer, p, "rank"), e_shape);
  c.expert_rank.assign(c.num_experts, 0);
  for (int e = 0; e < c.num_experts; ++e) {
    if (mask[e] == 0) continue;
    if (ranks[e] <= 0 || ranks[e] > c.rank)
      fail(ErrorKind::bad_file, path + ": layer " + std::to_string(layer) + " expert " + std::to_string(e) + " " + projection_name(p) +
                                    ": rank " + std::to_string(ranks[e]) + " is outside [1, " + std::to_string(c.rank) + "]");
    c.expert_rank[e] = static_cast<int>(ranks[e]);
  }
  auto ka = f.metadata().find(meta_key("peft_key", layer, p, "a"));
  auto kb = f.metadata().find(meta_key("peft_key", layer, p, "b"));
  if (ka != f.metadata().end() && kb != f.metadata().end()) {
    c.key_template_a = ka->second;
    c.key_template_b = kb->second;
  }
  c.dtype_a = parse_dtype_list(f, meta_key("peft_dtype", layer, p, "a"), c.num_experts, a->dtype);
  c.dtype_b = parse_dtype_list(f, meta_key("peft_dtype", layer, p, "b"), c.num_experts, c.b->dtype);
  const std::string stacked_key = meta_key("peft_stacked", layer, p, "ab");
  if (auto it = f.metadata().find(stacked_key); it != f.metadata().end()) {
    auto bad = [&](const std::string& what) {
      fail(ErrorKind::bad_file, path + ": metadata '" + stacked_key + "' " + what +
                                    " (expected {\"a\": key, \"b\": key, \"first_row\": n, \"b_rows\": n})");
    };
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(it->second);
    } catch (const nlohmann::json::exception&) {
      bad("is not JSON");
    }
    if (!j.is_object() || !j.contains("a") || !j["a"].is_string() || !j.contains("b") || !j["b"].is_string() ||
        !j.contains("first_row") || !j["first_row"].is_number_integer() || !j.contains("b_rows") || !j["b_rows"].is_number_integer())
      bad("lacks a field or has one of the wrong type");
    const long long first_row = j["first_row"].get<long long>(), b_rows = j["b_rows"].get<long long>();
    // Rows first_row + i * row_step (gpt-oss interleaves gate's and up's: 2); absent: 1.
    long long step = 1;
    if (j.contains("row_step")) {
      if (!j["row_step"].is_number_integer()) bad("has a row_step that is not an integer");
      step = j["row_step"].get<long long>();
    }
    if (step < 1 || step > 2) bad("has row_step " + std::to_string(step) + " (1, or 2 for gate and up interleaved)");
    if (first_row < 0 || b_rows <= 0 || b_rows > (1LL << 30) || first_row + (static_cast<long long>(c.out) - 1) * step + 1 > b_rows)
      bad("has rows " + std::to_string(first_row) + " + " + std::to_string(c.out) + (step > 1 ? " x " + std::to_string(step) : "") +
          " outside B's " + std::to_string(b_rows));
    for (int e = 0; e < c.num_experts; ++e)
      if (c.expert_rank[e] != c.rank) bad("but expert " + std::to_string(e) + " is not at the file's rank " + std::to_string(c.rank));
    c.stacked.key_a = j["a"].get<std::string>();
    c.stacked.key_b = j["b"].get<std::string>();
    c.stacked.first_row = static_cast<int>(first_row);
    c.stacked.row_step = static_cast<int>(step);
    c.stacked.b_rows = static_cast<int>(b_rows);
    c.stacked.dtype_a = c.dtype_a[0];
    c.stacked.dtype_b = c.dtype_b[0];
  }
  return c;
}

LoadedLora load_converted_layer(const std::string& path, const ModelConfig& model, int layer) {
  auto f = io::SafetensorsFile::open(path);
  require_lora_file(f, "pass a PEFT adapter directory or the output of `tilemoe convert-lora`");
  const MoeShape& s = model.shape;
  if (meta_int(f, "hidden_size") != s.hidden || meta_int(f, "intermediate_size") != s.intermediate ||
      meta_int(f, "num_experts") != s.num_experts)
    fail(ErrorKind::bad_file, path + ": made for hidden " + std::to_string(meta_int(f, "hidden_size")) + ", intermediate " +
                                  std::to_string(meta_int(f, "intermediate_size")) + ", " + std::to_string(meta_int(f, "num_experts")) +
                                  " experts; the model has " + std::to_string(s.hidden) + ", " + std::to_string(s.intermediate) + ", " +
                                  std::to_string(s.num_experts));
  if (!model.is_moe_layer(layer))
    fail(ErrorKind::invalid_argument, "layer " + std::to_string(layer) + " is not a MoE layer (MoE layers: " + model.moe_layers_string() + ")");
  LoadedLora out;
  if (auto config = f.metadata().find("adapter_config"); config != f.metadata().end()) out.adapter_config = config->second;
  bool any = false;
  for (Projection p : kProjections) {
    auto c = converted_projection(f, layer, p);
    if (!c) continue;
    any = true;
    int in = projection_in(s, p), o = projection_out(s, p);
    if (c->num_experts != s.num_experts || c->in != in || c->out != o)
      fail(ErrorKind::bad_file, path + ": '" + c->a->name + "' has shape " + io::shape_string(c->a->shape) + " and '" + c->b->name +
                                    "' " + io::shape_string(c->b->shape) + ", expected [" + std::to_string(s.num_experts) + ", r, " +
                                    std::to_string(in) + "] and [" + std::to_string(s.num_experts) + ", " + std::to_string(o) + ", r]");
    auto& proj = out.lora[p];
    proj.allocate(s.num_experts, c->rank, in, o);
    proj.a = io::read_as_f32(f, c->a->name);
    proj.b = io::read_as_f32(f, c->b->name);
    std::vector<std::int64_t> e_shape{s.num_experts};
    proj.scale = io::read_as_f32(f, tensor_key(layer, p, "scale"), e_shape);
    require_finite(proj.a.data(), proj.a.size(), path + ": '" + c->a->name + "'");
    require_finite(proj.b.data(), proj.b.size(), path + ": '" + c->b->name + "'");
    for (int e = 0; e < s.num_experts; ++e) {
      proj.present[e] = c->expert_rank[e] > 0 ? 1 : 0;
      proj.expert_rank[e] = c->expert_rank[e];
      if (!proj.present[e]) proj.scale[e] = 0.0f;
    }
    out.key_template_a[static_cast<int>(p)] = c->key_template_a;
    out.key_template_b[static_cast<int>(p)] = c->key_template_b;
    out.dtype_a[static_cast<int>(p)] = c->dtype_a;
    out.dtype_b[static_cast<int>(p)] = c->dtype_b;
    out.stacked[static_cast<int>(p)] = c->stacked;
  }
  if (!any) out.warnings.push_back(path + ": no LoRA for layer " + std::to_string(layer) + "; its experts run without LoRA");
  return out;
}

}  // namespace tilemoe
