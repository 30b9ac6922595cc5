#include "src/lora/peft_export.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <deque>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <system_error>

#include "src/io/f32_encode.hpp"
#include "src/io/safetensors_writer.hpp"
#include "src/lora/lora_file.hpp"
#include "src/lora/lora_view.hpp"
#include "src/model/tensor_names.hpp"
#include "tilemoe/error.hpp"

namespace tilemoe {
namespace fs = std::filesystem;
namespace {

// One PEFT tensor, produced while the writer writes the file.
struct OutTensor {
  std::string key;
  io::Dtype dtype;
  std::vector<std::int64_t> shape;
  io::SafetensorsWriter::Fill fill;
};

io::Dtype target_dtype(ExportDtype choice, io::Dtype original) {
  switch (choice) {
    case ExportDtype::same: return original;
    case ExportDtype::f32: return io::Dtype::F32;
    case ExportDtype::bf16: return io::Dtype::BF16;
  }
  return original;
}

// `count` elements from one dtype to another: bytes when the same, else through float (in chunks,
// so a large tensor needs no float copy of itself), which is exact for every value the target holds.
void convert_elements(const std::byte* src, io::Dtype src_dtype, std::size_t count, std::byte* dst, io::Dtype dst_dtype) {
  if (src_dtype == dst_dtype) {
    std::memcpy(dst, src, count * io::dtype_size(src_dtype));
    return;
  }
  constexpr std::size_t kChunk = 16384;
  float buf[kChunk];
  for (std::size_t i = 0; i < count; i += kChunk) {
    std::size_t n = std::min(kChunk, count - i);
    io::convert_to_f32(src_dtype, src + i * io::dtype_size(src_dtype), n, buf);
    io::convert_from_f32(buf, n, dst_dtype, dst + i * io::dtype_size(dst_dtype));
  }
}

// rows x cols elements, rows `src_stride` elements apart in `src`, packed into `dst`.
void copy_matrix(const std::byte* src, io::Dtype src_dtype, std::size_t src_stride, int rows, int cols, std::byte* dst,
                 io::Dtype dst_dtype) {
  std::size_t ss = io::dtype_size(src_dtype), ds = io::dtype_size(dst_dtype);
  for (int r = 0; r < rows; ++r)
    convert_elements(src + static_cast<std::size_t>(r) * src_stride * ss, src_dtype, cols,
                     dst + static_cast<std::size_t>(r) * cols * ds, dst_dtype);
}

// Written to a temporary name, synced, renamed by the caller once the adapter file is in place.
std::string write_temp_file(const std::string& path, const std::string& text) {
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  auto io_error = [&](const std::string& what, int err) {
    ::unlink(tmp.c_str());
    fail(ErrorKind::bad_file, path + ": " + what + ": " + std::system_category().message(err));
  };
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) fail(ErrorKind::bad_file, path + ": cannot create '" + tmp + "': " + std::system_category().message(errno));
  for (std::size_t off = 0; off < text.size();) {
    ssize_t n = ::write(fd, text.data() + off, text.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      io_error("cannot write", err);
    }
    off += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0) {
    int err = errno;
    ::close(fd);
    io_error("cannot sync", err);
  }
  if (::close(fd) != 0) io_error("cannot close", errno);
  return tmp;
}

// adapter_model.safetensors, then adapter_config.json, each renamed into place; a directory made
// here is removed again when anything fails, so a failed export leaves nothing behind.
void write_adapter_dir(const std::string& out_dir, const std::string& config_json, const io::SafetensorsWriter& w) {
  std::error_code ec;
  bool existed = fs::exists(out_dir, ec);
  if (existed && !fs::is_directory(out_dir, ec))
    fail(ErrorKind::bad_file, out_dir + ": exists and is not a directory (the output is a PEFT adapter directory)");
  if (!existed) {
    fs::create_directories(out_dir, ec);
    if (ec) fail(ErrorKind::bad_file, out_dir + ": cannot create the directory: " + ec.message());
  }
  const std::string config_path = (fs::path(out_dir) / "adapter_config.json").string();
  std::string config_tmp;
  try {
    config_tmp = write_temp_file(config_path, config_json);
    w.write((fs::path(out_dir) / "adapter_model.safetensors").string());
    if (::rename(config_tmp.c_str(), config_path.c_str()) != 0)
      fail(ErrorKind::bad_file, config_path + ": cannot rename '" + config_tmp + "' onto it: " + std::system_category().message(errno));
  } catch (...) {
    if (!config_tmp.empty()) ::unlink(config_tmp.c_str());
    if (!existed) fs::remove_all(out_dir, ec);
    throw;
  }
}

PeftExportStats write_tensors(const std::string& out_dir, const std::string& config_json, const std::vector<OutTensor>& tensors,
                              const PeftExtras& extras, ExportDtype dtype, const ProgressFn& progress) {
  if (config_json.empty())
    fail(ErrorKind::invalid_argument, out_dir + ": no adapter_config.json text to write (PeftConfig::json_text is empty)");
  struct Counter {
    std::size_t done = 0, total = 0;
  };
  auto counter = std::make_shared<Counter>();
  auto report = [counter, progress](std::size_t n) {
    counter->done += n;
    if (progress) progress(counter->done, counter->total);
  };
  io::SafetensorsWriter w;
  for (const auto& [k, v] : extras.file_metadata) w.set_metadata(k, v);
  for (const OutTensor& t : tensors) {
    std::size_t n = io::dtype_size(t.dtype);
    for (auto d : t.shape) n *= static_cast<std::size_t>(d);
    counter->total += n;
    w.add_streamed(t.key, t.dtype, t.shape, [fill = t.fill, report](std::byte* dst, std::size_t bytes) {
      fill(dst, bytes);
      report(bytes);
    });
  }
  // --dtype applies to the whole adapter: the float tensors tilemoe does not run follow it too.
  for (const VerbatimTensor& t : extras.tensors) {
    bool is_float = t.dtype == io::Dtype::BF16 || t.dtype == io::Dtype::F16 || t.dtype == io::Dtype::F32;
    io::Dtype dt = is_float ? target_dtype(dtype, t.dtype) : t.dtype;
    std::size_t numel = 1;
    for (auto d : t.shape) numel *= static_cast<std::size_t>(d);
    counter->total += numel * io::dtype_size(dt);
    w.add_streamed(t.key, dt, t.shape, [&t, dt, numel, report](std::byte* dst, std::size_t bytes) {
      convert_elements(t.data, t.dtype, numel, dst, dt);
      report(bytes);
    });
  }
  write_adapter_dir(out_dir, config_json, w);
  PeftExportStats stats;
  stats.expert_tensors = static_cast<int>(tensors.size());
  stats.other_tensors = static_cast<int>(extras.tensors.size());
  stats.bytes = counter->total;
  return stats;
}

}  // namespace

std::optional<ExportDtype> parse_export_dtype(std::string_view name) {
  if (name == "same") return ExportDtype::same;
  if (name == "f32") return ExportDtype::f32;
  if (name == "bf16") return ExportDtype::bf16;
  return std::nullopt;
}

PeftExtras peft_extras(const PeftAdapter& adapter) {
  PeftExtras x;
  x.file_metadata = adapter.file().metadata();
  for (const std::string& key : adapter.other_keys()) {
    const io::TensorInfo& t = adapter.file().get(key);
    x.tensors.push_back({key, t.dtype, t.shape, adapter.file().data(t)});
  }
  return x;
}

PeftExtras converted_extras(const io::SafetensorsFile& f) {
  PeftExtras x;
  const std::string prefix = kVerbatimPrefix;
  for (const auto& t : f.tensors())
    if (t.name.rfind(prefix, 0) == 0) x.tensors.push_back({t.name.substr(prefix.size()), t.dtype, t.shape, f.data(t)});
  auto it = f.metadata().find(kPeftFileMetadataKey);
  if (it != f.metadata().end()) {
    try {
      x.file_metadata = nlohmann::json::parse(it->second).get<std::map<std::string, std::string>>();
    } catch (const nlohmann::json::exception& e) {
      fail(ErrorKind::bad_file, f.path() + ": metadata '" + kPeftFileMetadataKey + "' is not a JSON object of strings (" + e.what() + ")");
    }
  }
  return x;
}

namespace {

io::Dtype io_dtype(LoraDType d) { return d == LoraDType::bf16 ? io::Dtype::BF16 : io::Dtype::F32; }

// Whether two projections' A hold the same values for every expert (a stacked A they share).
bool same_a(const LoraProjectionView& x, const LoraProjectionView& y, int experts) {
  if (x.rank != y.rank || x.in != y.in) return false;
  for (int e = 0; e < experts; ++e)
    for (int j = 0; j < x.rank; ++j)
      for (int c = 0; c < x.in; ++c) {
        const std::size_t off = static_cast<std::size_t>(j) * x.lda() + c;
        const float u = factor_value(x.a_of(e), x.dtype, off), v = factor_value(y.a_of(e), y.dtype, off);
        if (!(u == v || (std::isnan(u) && std::isnan(v)))) return false;
      }
  return true;
}

// The layer's LoRA on stacked expert tensors, laid out as PEFT stores it (see PeftStackedEntry).
// Projections that share one stacked A (gate and up of gate_up_proj) must hold the same A.
bool add_stacked_tensors(const PeftLayerOut& l, ExportDtype dtype, std::vector<OutTensor>& tensors) {
  bool any = false;
  for (Projection p : kProjections) {
    const int pi = static_cast<int>(p);
    const auto& keys = l.stacked[pi];
    if (keys.empty()) continue;
    bool first_of_a = true, first_of_b = true;
    for (Projection q : kProjections) {
      if (q == p) break;
      if (l.stacked[static_cast<int>(q)].key_a == keys.key_a) first_of_a = false;
      if (l.stacked[static_cast<int>(q)].key_b == keys.key_b) first_of_b = false;
    }
    const LoraProjectionView& proj = l.lora[p];
    const int E = l.num_experts, r = proj.rank;
    const std::string where = "layer " + std::to_string(l.layer) + " " + projection_name(p) + " (stacked LoRA '" + keys.key_a + "')";
    for (int e = 0; e < E; ++e)
      if (!proj.active(e) || (!l.expert_rank[pi].empty() && l.expert_rank[pi][e] != r))
        fail(ErrorKind::invalid_argument, where + ": expert " + std::to_string(e) +
                                              " has no LoRA or another rank; a stacked LoRA has every expert at one rank");
    if (!first_of_a) {
      for (Projection q : kProjections) {  // the projection that writes the shared A
        if (q == p || l.stacked[static_cast<int>(q)].key_a != keys.key_a) continue;
        if (!same_a(l.lora[q], proj, E))
          fail(ErrorKind::invalid_argument, where + ": " + projection_name(q) + " and " + projection_name(p) +
                                                " share one A in this adapter, but their A differ (a trainer steps the shared A with the sum "
                                                "of both gradients, which stacked_lora_grads gives)");
        break;
      }
    }
    any = true;
    const int in = proj.in, b_rows = keys.b_rows;
    if (first_of_a) {
      const io::Dtype da = target_dtype(dtype, keys.dtype_a);
      tensors.push_back({keys.key_a, da, {static_cast<std::int64_t>(r) * E, in}, [proj, r, E, in, da](std::byte* dst, std::size_t) {
                           // expert e's A rows are the stacked rows e*r + j
                           const std::size_t per_expert = static_cast<std::size_t>(r) * in * io::dtype_size(da);
                           for (int e = 0; e < E; ++e)
                             copy_matrix(static_cast<const std::byte*>(proj.a_of(e)), io_dtype(proj.dtype), proj.lda(), r, in,
                                         dst + e * per_expert, da);
                         }});
    }
    // B: every projection sharing the key writes its rows; the first one creates the tensor.
    if (!first_of_b) continue;
    std::vector<std::tuple<LoraProjectionView, int, int>> writers;  // view, first row, row step
    for (Projection q : kProjections)
      if (const auto& k = l.stacked[static_cast<int>(q)]; k.key_b == keys.key_b) writers.emplace_back(l.lora[q], k.first_row, k.row_step);
    const io::Dtype db = target_dtype(dtype, keys.dtype_b);
    tensors.push_back({keys.key_b, db, {b_rows, static_cast<std::int64_t>(r) * E}, [writers, r, E, b_rows, db](std::byte* dst, std::size_t) {
                         const std::size_t cols = static_cast<std::size_t>(r) * E;
                         std::vector<float> full(static_cast<std::size_t>(b_rows) * cols, 0.0f);
                         for (const auto& [w, row0, step] : writers)
                           for (int e = 0; e < E; ++e)
                             for (int row = 0; row < w.out; ++row)
                               for (int j = 0; j < r; ++j)
                                 full[peft_stacked_b_index(static_cast<std::size_t>(row0) + static_cast<std::size_t>(row) * step, j, e, r, E)] =
                                     factor_value(w.b_of(e), w.dtype, static_cast<std::size_t>(row) * w.rank + j);
                         copy_matrix(reinterpret_cast<const std::byte*>(full.data()), io::Dtype::F32, static_cast<int>(cols), b_rows,
                                     static_cast<int>(cols), dst, db);
                       }});
  }
  return any;
}

}  // namespace

PeftExportStats write_peft_layers(const std::string& out_dir, const std::string& config_json, const std::vector<PeftLayerOut>& layers,
                                  const PeftExportOptions& options) {
  std::vector<OutTensor> tensors;
  int layers_written = 0;
  for (const PeftLayerOut& l : layers) {
    for (Projection p : kProjections) {
      const auto pi = static_cast<std::size_t>(p);
      for (const std::size_t n : {l.expert_rank[pi].size(), l.dtype_a[pi].size(), l.dtype_b[pi].size()})
        if (l.lora[p].rank > 0 && n != 0 && n != static_cast<std::size_t>(l.num_experts))
          fail(ErrorKind::invalid_argument, "layer " + std::to_string(l.layer) + " " + projection_name(p) + ": per-expert arrays of " +
                                                std::to_string(n) + " entries for " + std::to_string(l.num_experts) + " experts");
    }
    bool any = false;
    for (Projection p : kProjections) {
      const LoraProjectionView& proj = l.lora[p];
      if (proj.rank == 0) continue;
      const int pi = static_cast<int>(p);
      const int experts = l.num_experts;
      if (!l.stacked[pi].empty()) continue;  // added below, with the projections sharing its keys
      if (l.key_template_a[pi].empty() || l.key_template_b[pi].empty())
        fail(ErrorKind::invalid_argument, "layer " + std::to_string(l.layer) + " " + projection_name(p) +
                                              ": LoRA without PEFT key names (LoadedLora::key_template_a/b, which load_layer_lora fills)");
      auto dtype_of = [&](const std::vector<io::Dtype>& known, int e) {
        return static_cast<int>(known.size()) == experts ? known[e] : io_dtype(proj.dtype);
      };
      for (int e = 0; e < experts; ++e) {
        if (!proj.active(e)) continue;
        any = true;
        const int er = l.expert_rank[pi].empty() ? 0 : l.expert_rank[pi][e];
        const int r = er > 0 && er <= proj.rank ? er : proj.rank;
        const auto* a = static_cast<const std::byte*>(proj.a_of(e));
        const auto* b = static_cast<const std::byte*>(proj.b_of(e));
        const io::Dtype src = io_dtype(proj.dtype);
        const io::Dtype da = target_dtype(options.dtype, dtype_of(l.dtype_a[pi], e));
        const io::Dtype db = target_dtype(options.dtype, dtype_of(l.dtype_b[pi], e));
        const int in = proj.in, out = proj.out, padded = proj.rank;
        const std::size_t lda = proj.lda();
        tensors.push_back({expand_expert_key_template(l.key_template_a[pi], e), da, {r, in},
                           [a, src, lda, r, in, da](std::byte* dst, std::size_t) { copy_matrix(a, src, lda, r, in, dst, da); }});
        tensors.push_back({expand_expert_key_template(l.key_template_b[pi], e), db, {out, r},
                           [b, src, r, out, padded, db](std::byte* dst, std::size_t) { copy_matrix(b, src, padded, out, r, dst, db); }});
      }
    }
    any = add_stacked_tensors(l, options.dtype, tensors) || any;
    layers_written += any ? 1 : 0;
  }
  PeftExportStats stats = write_tensors(out_dir, config_json, tensors, options.extras, options.dtype, options.progress);
  stats.layers = layers_written;
  return stats;
}

namespace {

// A LoadedLora as written: its f32 factors read in place, the file's dtypes and expert ranks.
PeftLayerOut layer_out(int layer, const LoadedLora& lora) {
  PeftLayerOut l;
  l.layer = layer;
  l.lora = lora_view(lora.lora);
  for (const auto& proj : lora.lora.proj)
    if (proj.rank > 0) l.num_experts = static_cast<int>(proj.present.size());
  for (Projection p : kProjections) {
    const int pi = static_cast<int>(p);
    const auto& proj = lora.lora[p];
    l.expert_rank[pi] = proj.expert_rank;
    l.key_template_a[pi] = lora.key_template_a[pi];
    l.key_template_b[pi] = lora.key_template_b[pi];
    l.stacked[pi] = lora.stacked[pi];
    const std::size_t experts = proj.present.size();
    // Unknown dtypes are written as f32, as the factors are held.
    l.dtype_a[pi] = lora.dtype_a[pi].size() == experts ? lora.dtype_a[pi] : std::vector<io::Dtype>(experts, io::Dtype::F32);
    l.dtype_b[pi] = lora.dtype_b[pi].size() == experts ? lora.dtype_b[pi] : std::vector<io::Dtype>(experts, io::Dtype::F32);
  }
  return l;
}

}  // namespace

PeftExportStats write_peft_adapter(const std::string& out_dir, const PeftConfig& config,
                                   const std::vector<std::pair<int, const LoadedLora*>>& layers, const PeftExportOptions& options) {
  std::vector<PeftLayerOut> out;
  for (const auto& [layer, lora] : layers) {
    for (Projection p : kProjections) {
      const auto& proj = lora->lora[p];
      if (proj.rank == 0) continue;
      const int experts = static_cast<int>(proj.present.size());
      const std::size_t a_size = static_cast<std::size_t>(experts) * proj.rank * proj.in;
      const std::size_t b_size = static_cast<std::size_t>(experts) * proj.out * proj.rank;
      if (proj.a.size() != a_size || proj.b.size() != b_size || proj.expert_rank.size() != proj.present.size() ||
          proj.scale.size() != proj.present.size())
        fail(ErrorKind::invalid_argument, "layer " + std::to_string(layer) + " " + projection_name(p) + ": A has " +
                                              std::to_string(proj.a.size()) + " values and B " + std::to_string(proj.b.size()) +
                                              ", expected " + std::to_string(a_size) + " and " + std::to_string(b_size) +
                                              " for its experts, rank, in and out");
    }
    out.push_back(layer_out(layer, *lora));
  }
  return write_peft_layers(out_dir, config.json_text, out, options);
}

PeftExportStats export_lora_file(const std::string& lora_file, const std::string& out_dir, ExportDtype dtype, const ProgressFn& progress) {
  if (fs::is_directory(lora_file)) {
    bool peft = fs::exists(fs::path(lora_file) / "adapter_config.json");
    fail(ErrorKind::bad_file, lora_file + ": is a " + (peft ? "PEFT adapter directory already" : "directory") +
                                  "; export-peft takes a file written by `tilemoe convert-lora`");
  }
  if (!fs::exists(lora_file)) fail(ErrorKind::bad_file, lora_file + ": no such file");
  auto f = io::SafetensorsFile::open(lora_file);
  require_lora_file(f, "export-peft takes a file written by `tilemoe convert-lora`");
  auto config = f.metadata().find("adapter_config");
  if (config == f.metadata().end() || config->second.empty())
    fail(ErrorKind::bad_file, lora_file + ": metadata 'adapter_config' is missing, so there is no adapter_config.json to write");

  std::vector<OutTensor> tensors;
  std::vector<int> layers = converted_layers(f);
  std::deque<LoadedLora> stacked;  // read whole (one layer's LoRA is small): the fills point into them
  for (int layer : layers) {
    LoadedLora* layer_stacked = nullptr;
    for (Projection p : kProjections) {
      auto c = converted_projection(f, layer, p);
      if (!c) continue;
      if (!c->stacked.empty()) {
        if (!layer_stacked) layer_stacked = &stacked.emplace_back();
        auto& proj = layer_stacked->lora[p];
        proj.allocate(c->num_experts, c->rank, c->in, c->out);
        proj.a = io::read_as_f32(f, c->a->name);
        proj.b = io::read_as_f32(f, c->b->name);
        std::fill(proj.present.begin(), proj.present.end(), 1);
        proj.expert_rank = c->expert_rank;
        layer_stacked->stacked[static_cast<int>(p)] = c->stacked;
        continue;
      }
      if (c->key_template_a.empty() || c->key_template_b.empty())
        fail(ErrorKind::bad_file, lora_file + ": layer " + std::to_string(layer) + " " + projection_name(p) +
                                      " has no PEFT key names (metadata 'peft_key.*'); convert the adapter again");
      const io::Dtype sa = c->a->dtype, sb = c->b->dtype;
      const std::size_t a_expert = static_cast<std::size_t>(c->rank) * c->in * io::dtype_size(sa);
      const std::size_t b_expert = static_cast<std::size_t>(c->out) * c->rank * io::dtype_size(sb);
      for (int e = 0; e < c->num_experts; ++e) {
        int r = c->expert_rank[e];
        if (r == 0) continue;
        const std::byte* a = f.data(*c->a) + e * a_expert;
        const std::byte* b = f.data(*c->b) + e * b_expert;
        io::Dtype da = target_dtype(dtype, c->dtype_a[e]), db = target_dtype(dtype, c->dtype_b[e]);
        int in = c->in, out = c->out, padded = c->rank;
        tensors.push_back({expand_expert_key_template(c->key_template_a, e), da, {r, in},
                           [a, sa, r, in, da](std::byte* dst, std::size_t) { copy_matrix(a, sa, in, r, in, dst, da); }});
        tensors.push_back({expand_expert_key_template(c->key_template_b, e), db, {out, r},
                           [b, sb, r, out, padded, db](std::byte* dst, std::size_t) { copy_matrix(b, sb, padded, out, r, dst, db); }});
      }
    }
    if (layer_stacked) {
      add_stacked_tensors(layer_out(layer, *layer_stacked), dtype, tensors);
    }
  }
  PeftExtras extras = converted_extras(f);
  PeftExportStats stats = write_tensors(out_dir, config->second, tensors, extras, dtype, progress);
  stats.layers = static_cast<int>(layers.size());
  auto version = f.metadata().find("format_version");
  if (version == f.metadata().end() || version->second == "1")
    stats.warnings.push_back(lora_file +
                             ": written by an older convert-lora, which kept neither the adapter's keys other than routed-expert LoRA "
                             "(any are missing from the export) nor its dtypes (--dtype same writes them as stored, BF16 or F32)");
  return stats;
}

}  // namespace tilemoe
