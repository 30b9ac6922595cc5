#include "src/lora/lora_file.hpp"

#include <cstdint>
#include <cstring>
#include <memory>
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

std::string meta_key(int layer, Projection p, const char* factor) {
  return "peft_key.layer_" + std::to_string(layer) + "." + projection_name(p) + "." + factor;
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

}  // namespace

ConvertStats convert_peft_to_lora_file(const PeftAdapter& adapter, const ModelConfig& model, const std::string& output,
                                       const ProgressFn& progress) {
  const MoeShape& s = model.shape;
  const io::SafetensorsFile& src = adapter.file();
  // Keep bf16 adapters in bf16 (half the bytes); anything else becomes f32, which loses nothing.
  bool all_bf16 = true;
  for (int layer : adapter.layers())
    for (const auto& list : *adapter.layer_entries(layer))
      for (const auto& e : list)
        if (e.rank > 0 && (src.get(e.key_a).dtype != io::Dtype::BF16 || src.get(e.key_b).dtype != io::Dtype::BF16)) all_bf16 = false;
  io::Dtype out_dtype = all_bf16 ? io::Dtype::BF16 : io::Dtype::F32;
  std::size_t esize = io::dtype_size(out_dtype);

  io::SafetensorsWriter w;
  ConvertStats stats;
  stats.ignored_keys = adapter.ignored_keys();
  std::size_t total = 0;
  auto done = std::make_shared<std::size_t>(0);
  int max_rank = 0;
  std::string layer_list;
  std::set<std::string> templates_written;
  for (int layer : adapter.layers()) {
    ++stats.layers;
    layer_list += (layer_list.empty() ? "" : ",") + std::to_string(layer);
    const auto& entries = *adapter.layer_entries(layer);
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
      for (int e = 0; e < s.num_experts; ++e) {
        if (list[e].rank == 0) continue;
        mask[e] = 1;
        scale[e] = static_cast<float>(list[e].scale);
        ranks[e] = list[e].rank;
        stats.expert_tensors += 2;
        if (templates_written.insert(meta_key(layer, p, "a")).second) {
          w.set_metadata(meta_key(layer, p, "a"), expert_key_template(list[e].key_a, e));
          w.set_metadata(meta_key(layer, p, "b"), expert_key_template(list[e].key_b, e));
        }
      }
      std::size_t a_bytes = static_cast<std::size_t>(s.num_experts) * rank * in * esize;
      std::size_t b_bytes = static_cast<std::size_t>(s.num_experts) * out * rank * esize;
      total += a_bytes + b_bytes;
      // A: each expert's [r_e, in] block is contiguous in both files; rows past r_e are zero.
      w.add_streamed(tensor_key(layer, p, "a"), out_dtype, {s.num_experts, rank, in},
                     [&src, &list, rank, in, esize, out_dtype, done, progress, total_ref = &total](std::byte* dst, std::size_t n) {
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
                       *done += n;
                       if (progress) progress(*done, *total_ref);
                     });
      // B: [out, r_e] rows are re-strided to [out, r].
      w.add_streamed(tensor_key(layer, p, "b"), out_dtype, {s.num_experts, out, rank},
                     [&src, &list, rank, out, esize, out_dtype, done, progress, total_ref = &total](std::byte* dst, std::size_t n) {
                       prefetch_sources(src, list, false);
                       std::memset(dst, 0, n);
                       std::size_t per_expert = static_cast<std::size_t>(out) * rank * esize;
                       std::vector<float> row;
                       for (std::size_t e = 0; e < list.size(); ++e) {
                         int re = list[e].rank;
                         if (re == 0) continue;
                         const auto& t = src.get(list[e].key_b);
                         const std::byte* s0 = src.data(t);
                         std::size_t src_row = static_cast<std::size_t>(re) * io::dtype_size(t.dtype);
                         row.resize(re);
                         for (int r = 0; r < out; ++r) {
                           std::byte* d = dst + e * per_expert + static_cast<std::size_t>(r) * rank * esize;
                           if (t.dtype == out_dtype) std::memcpy(d, s0 + r * src_row, src_row);
                           else io::convert_to_f32(t.dtype, s0 + r * src_row, re, reinterpret_cast<float*>(d));
                         }
                       }
                       *done += n;
                       if (progress) progress(*done, *total_ref);
                     });
      w.add_streamed(tensor_key(layer, p, "mask"), io::Dtype::U8, {s.num_experts},
                     [mask](std::byte* dst, std::size_t n) { std::memcpy(dst, mask.data(), n); });
      w.add_f32(tensor_key(layer, p, "scale"), {s.num_experts}, scale);
      w.add_streamed(tensor_key(layer, p, "rank"), io::Dtype::I32, {s.num_experts},
                     [ranks](std::byte* dst, std::size_t n) { std::memcpy(dst, ranks.data(), n); });
    }
  }
  const PeftConfig& c = adapter.config();
  w.set_metadata("format", kLoraFileFormat);
  w.set_metadata("format_version", "1");
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
  w.write(output);
  stats.bytes_written = total;
  return stats;
}

LoadedLora load_converted_layer(const std::string& path, const ModelConfig& model, int layer) {
  auto f = io::SafetensorsFile::open(path);
  auto fmt = f.metadata().find("format");
  if (fmt == f.metadata().end() || fmt->second != kLoraFileFormat)
    fail(ErrorKind::bad_file, path + ": not a tilemoe LoRA file (metadata 'format' is not '" + kLoraFileFormat +
                                  "'); pass a PEFT adapter directory or the output of `tilemoe convert-lora`");
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
  bool any = false;
  for (Projection p : kProjections) {
    if (!f.find(tensor_key(layer, p, "a"))) continue;
    any = true;
    const auto& ta = f.get(tensor_key(layer, p, "a"));
    int in = projection_in(s, p), o = projection_out(s, p);
    if (ta.shape.size() != 3 || ta.shape[0] != s.num_experts || ta.shape[2] != in || ta.shape[1] <= 0)
      fail(ErrorKind::bad_file, path + ": '" + ta.name + "' has shape " + io::shape_string(ta.shape) + ", expected [" +
                                    std::to_string(s.num_experts) + ", r, " + std::to_string(in) + "]");
    int rank = static_cast<int>(ta.shape[1]);
    std::vector<std::int64_t> b_shape{s.num_experts, o, rank}, e_shape{s.num_experts};
    auto& proj = out.lora[p];
    proj.allocate(s.num_experts, rank, in, o);
    proj.a = io::read_as_f32(f, ta.name);
    proj.b = io::read_as_f32(f, tensor_key(layer, p, "b"), b_shape);
    proj.scale = io::read_as_f32(f, tensor_key(layer, p, "scale"), e_shape);
    require_finite(proj.a.data(), proj.a.size(), path + ": '" + ta.name + "'");
    require_finite(proj.b.data(), proj.b.size(), path + ": '" + tensor_key(layer, p, "b") + "'");
    auto mask = io::read_as_i64(f, tensor_key(layer, p, "mask"), e_shape);
    auto ranks = io::read_as_i64(f, tensor_key(layer, p, "rank"), e_shape);
    for (int e = 0; e < s.num_experts; ++e) {
      if (ranks[e] < 0 || ranks[e] > rank)
        fail(ErrorKind::bad_file, path + ": layer " + std::to_string(layer) + " expert " + std::to_string(e) + " " + projection_name(p) +
                                      ": rank " + std::to_string(ranks[e]) + " is outside [0, " + std::to_string(rank) + "]");
      proj.present[e] = mask[e] != 0 ? 1 : 0;
      proj.expert_rank[e] = proj.present[e] ? static_cast<int>(ranks[e]) : 0;
      if (!proj.present[e]) proj.scale[e] = 0.0f;
    }
    auto ka = f.metadata().find(meta_key(layer, p, "a"));
    auto kb = f.metadata().find(meta_key(layer, p, "b"));
    if (ka != f.metadata().end() && kb != f.metadata().end()) {
      out.key_template_a[static_cast<int>(p)] = ka->second;
      out.key_template_b[static_cast<int>(p)] = kb->second;
    }
  }
  if (!any) out.warnings.push_back(path + ": no LoRA for layer " + std::to_string(layer) + "; its experts run without LoRA");
  return out;
}

}  // namespace tilemoe
