// QuantizedModelWriter: one safetensors file per layer (and node), written as soon as the layer
// is quantized, straight from the QuantizedExperts' memory (no second copy of the layer).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <system_error>

#include "src/io/safetensors_writer.hpp"
#include "src/model/checkpoint.hpp"
#include "src/quant/quantized_file.hpp"
#include "src/quant/quantized_file_format.hpp"
#include "tilemoe/error.hpp"

namespace tilemoe::quant {
namespace fs = std::filesystem;

namespace {

bool same_shape(const MoeShape& a, const MoeShape& b) {
  return a.hidden == b.hidden && a.intermediate == b.intermediate && a.num_experts == b.num_experts;
}

// The quantized layer is what the spec promised, down to its buffers' sizes: the files are
// written from raw pointers into them.
void check_layer(const QuantizedModelInfo& info, int layer, const QuantizedExperts& q) {
  const std::string what = "quantized layer " + std::to_string(layer);
  if (q.type != info.type || q.group != info.group)
    fail(ErrorKind::invalid_argument, what + " is " + weight_type_name(q.type) + " group " + std::to_string(q.group) + ", the directory " +
                                          weight_type_name(info.type) + " group " + std::to_string(info.group));
  if (!same_shape(q.shape, info.shape))
    fail(ErrorKind::invalid_argument, what + " has another shape than the directory's model");
  for (Projection p : kProjections) {
    const QuantizedProjection& qp = q[p];
    if (qp.type != info.type || qp.experts != info.shape.num_experts || qp.n != projection_out(info.shape, p) ||
        qp.k != projection_in(info.shape, p) || (is_four_bit_weight_type(info.type) && qp.group != info.group) ||
        qp.codes.size() != qp.expert_code_bytes() * qp.experts || qp.scales.size() != qp.expert_scale_count() * qp.experts)
      fail(ErrorKind::invalid_argument, what + ": the " + projection_name(p) + " projection's type, shape or buffers do not match its shape");
  }
}

}  // namespace

QuantizedModelWriter::QuantizedModelWriter(std::string dir, QuantizedModelSpec spec) : dir_(std::move(dir)), config_json_(std::move(spec.config_json)) {
  if (spec.type == WeightType::int8) spec.group = 0;
  format::check_spec(spec);
  info_.type = spec.type;
  info_.group = spec.group;
  info_.model_type = spec.model_type;
  info_.shape = spec.shape;
  info_.layers = spec.layers;
  info_.slices = numa_slices(spec.shape.intermediate, spec.numa_nodes);
  info_.name_templates = spec.name_templates;
  info_.source_hash = spec.source_hash;

  std::error_code ec;
  const auto st = fs::status(dir_, ec);
  if (fs::exists(st)) {
    if (!fs::is_directory(st)) fail(ErrorKind::invalid_argument, dir_ + ": exists and is not a directory");
    if (!fs::is_empty(dir_, ec) || ec)
      fail(ErrorKind::invalid_argument, dir_ + ": is not empty; the output of quantize is a new or empty directory");
  } else {
    fs::create_directories(dir_, ec);
    if (ec) fail(ErrorKind::bad_file, dir_ + ": cannot create the directory: " + ec.message());
    created_dir_ = true;
  }
  try {
    write_text("config.json", config_json_);
  } catch (...) {
    remove_written();  // no destructor runs for a constructor that throws
    throw;
  }
}

QuantizedModelWriter::~QuantizedModelWriter() {
  if (!committed_) remove_written();
}

void QuantizedModelWriter::remove_written() noexcept {
  std::error_code ec;
  for (auto it = written_.rbegin(); it != written_.rend(); ++it) fs::remove(*it, ec);
  if (created_dir_) fs::remove(dir_, ec);  // only when empty: never anything we did not write
}

void QuantizedModelWriter::write_text(const std::string& name, const std::string& text) {
  const std::string path = dir_ + "/" + name;
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    out.flush();
    if (!out) {
      std::error_code ec;
      fs::remove(tmp, ec);
      fail(ErrorKind::bad_file, path + ": cannot write");
    }
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    fail(ErrorKind::bad_file, path + ": cannot rename the written file onto it");
  }
  written_.push_back(path);
}

std::vector<std::string> QuantizedModelWriter::copy_routers(const Checkpoint& source) {
  std::vector<std::string> warnings;
  io::SafetensorsWriter w;
  std::vector<int> layers;
  for (int layer : info_.layers) {
    std::vector<std::string> names;
    try {
      names = source.router_tensor_names(layer);
    } catch (const Error& e) {
      warnings.push_back(std::string(e.what()) + "; the quantized directory has no router for layer " + std::to_string(layer));
      continue;
    }
    for (const auto& name : names) {
      const io::SafetensorsFile* f = source.file_of(name);
      const io::TensorInfo& t = f->get(name);
      w.add(name, t.dtype, t.shape, f->data(t));  // as stored: bytes, dtype and name
    }
    layers.push_back(layer);
  }
  if (layers.empty()) return warnings;
  const std::string path = dir_ + "/router.safetensors";
  w.write(path);
  written_.push_back(path);
  info_.router_file = "router.safetensors";
  info_.router_layers = layers;
  return warnings;
}

std::size_t QuantizedModelWriter::write_layer(int layer, const QuantizedExperts& q) {
  if (std::find(info_.layers.begin(), info_.layers.end(), layer) == info_.layers.end())
    fail(ErrorKind::invalid_argument, dir_ + ": layer " + std::to_string(layer) + " is not one of the layers this directory was made for");
  if (info_.files.count(layer)) fail(ErrorKind::state, dir_ + ": layer " + std::to_string(layer) + " was written already");
  check_layer(info_, layer, q);
  const int nodes = info_.numa_nodes();
  const io::Dtype codes_dtype = format::code_dtype(info_.type);
  std::vector<std::string> names;
  std::size_t bytes = 0;
  for (int node = 0; node < nodes; ++node) {
    const IntermediateSlice s = info_.slices[node];
    const MoeShape part = format::slice_shape(info_.shape, s);
    io::SafetensorsWriter w;
    for (const auto& [k, v] : format::file_metadata(info_, layer, node)) w.set_metadata(k, v);
    for (Projection p : kProjections) {
      const QuantizedProjection& qp = q[p];
      const std::string& tmpl = info_.name_templates[static_cast<int>(p)];
      for (int e = 0; e < info_.shape.num_experts; ++e) {
        const std::string base = expert_tensor_base(tmpl, layer, e);
        auto codes_shape = format::qweight_shape(info_.type, part, p);
        auto scales_shape = format::scales_shape(info_.type, info_.group, part, p);
        if (p != Projection::down || s.width() == info_.shape.intermediate) {
          // Rows [begin, end) of gate/up, or all of down: contiguous in memory.
          const std::size_t row0 = p == Projection::down ? 0 : static_cast<std::size_t>(s.begin);
          w.add(base + ".qweight", codes_dtype, std::move(codes_shape), qp.codes_of(e) + qp.row_bytes() * row0);
          w.add(base + ".scales", io::Dtype::F32, std::move(scales_shape), qp.scales_of(e) + qp.groups_per_row() * row0);
          continue;
        }
        // Down columns [begin, end) of every row, gathered into the file as it is written.
        // begin is a multiple of 128: even (whole int4 bytes) and a multiple of the group.
        const std::size_t byte0 = is_four_bit_weight_type(info_.type) ? s.begin / 2 : s.begin;
        const std::size_t row_bytes = static_cast<std::size_t>(codes_shape[1]);
        w.add_streamed(base + ".qweight", codes_dtype, std::move(codes_shape), [&qp, e, byte0, row_bytes](std::byte* dst, std::size_t) {
          for (int r = 0; r < qp.n; ++r) std::memcpy(dst + row_bytes * r, qp.codes_of(e) + qp.row_bytes() * r + byte0, row_bytes);
        });
        if (info_.type == WeightType::int8) {  // one scale per row, the whole row's
          w.add(base + ".scales", io::Dtype::F32, std::move(scales_shape), qp.scales_of(e));
          continue;
        }
        const std::size_t group0 = s.begin / info_.group, groups = static_cast<std::size_t>(scales_shape[1]);
        w.add_streamed(base + ".scales", io::Dtype::F32, std::move(scales_shape), [&qp, e, group0, groups](std::byte* dst, std::size_t) {
          for (int r = 0; r < qp.n; ++r)
            std::memcpy(dst + groups * sizeof(float) * r, qp.scales_of(e) + static_cast<std::size_t>(qp.groups_per_row()) * r + group0,
                        groups * sizeof(float));
        });
      }
    }
    const std::string name = format::layer_file_name(layer, node, nodes);
    const std::string path = dir_ + "/" + name;
    w.write(path);
    written_.push_back(path);
    names.push_back(name);
    std::error_code ec;
    bytes += fs::file_size(path, ec);
  }
  info_.files[layer] = std::move(names);
  return bytes;
}

void QuantizedModelWriter::commit() {
  for (int layer : info_.layers)
    if (!info_.files.count(layer))
      fail(ErrorKind::state, dir_ + ": layer " + std::to_string(layer) + " was not written; quantization.json is written last");
  write_text(kQuantizedIndexFile, format::index_text(info_));
  committed_ = true;
}

}  // namespace tilemoe::quant
