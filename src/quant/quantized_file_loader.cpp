// load_quantized_layer(_slice): reads a layer's files back into QuantizedExperts, checking the
// directory against the model and every file against the index before trusting a byte of it.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

#include "src/io/safetensors.hpp"
#include "src/quant/quantized_file.hpp"
#include "src/quant/quantized_file_format.hpp"
#include "tilemoe/error.hpp"

namespace tilemoe::quant {
namespace {

std::string layers_text(const std::vector<int>& v) {
  std::string s;
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s;
}

// The directory against the model the caller runs: the first field that differs.
void check_fits_model(const QuantizedModelInfo& info, const std::string& dir, int layer, const MoeShape& expected,
                      const std::string& source_hash) {
  const std::string index = dir + "/" + kQuantizedIndexFile;
  auto differ = [&](const char* field, int got, int want, const char* model_field) {
    if (got != want)
      fail(ErrorKind::invalid_argument, index + ": shape." + field + " is " + std::to_string(got) + " but the model's " + model_field +
                                            " is " + std::to_string(want));
  };
  differ("hidden", info.shape.hidden, expected.hidden, "hidden size");
  differ("intermediate", info.shape.intermediate, expected.intermediate, "expert intermediate size");
  differ("num_experts", info.shape.num_experts, expected.num_experts, "expert count");
  if (info.shape.top_k != 0 && expected.top_k != 0) differ("top_k", info.shape.top_k, expected.top_k, "top-k");
  if (!source_hash.empty() && source_hash != info.source_hash)
    fail(ErrorKind::invalid_argument, index + ": source.hash is " + info.source_hash + " but the model checkpoint's is " + source_hash +
                                          ": this directory was quantized from another checkpoint");
  if (!info.files.count(layer))
    fail(ErrorKind::invalid_argument, index + ": layer " + std::to_string(layer) + " was not quantized (layers: " + layers_text(info.layers) + ")");
}

QuantizedExperts allocate_experts(const QuantizedModelInfo& info, const MoeShape& shape) {
  QuantizedExperts q;
  q.shape = shape;
  q.type = info.type;
  q.group = info.group;
  for (Projection p : kProjections)
    q[p] = QuantizedProjection::allocate(info.type, shape.num_experts, projection_out(shape, p), projection_in(shape, p), info.group);
  return q;
}

void check_metadata(const io::SafetensorsFile& f, const QuantizedModelInfo& info, int layer, int node) {
  // format and format_version come first (the map is ordered, and they sort first): a file of
  // another format is called that, not a list of odd fields.
  for (const auto& [key, want] : format::file_metadata(info, layer, node)) {
    auto it = f.metadata().find(key);
    if (it == f.metadata().end())
      fail(ErrorKind::bad_file, f.path() + ": metadata '" + key + "' is missing (every file of a quantized directory has it)");
    if (it->second != want)
      fail(ErrorKind::bad_file, f.path() + ": metadata '" + key + "' is '" + it->second + "' but " + kQuantizedIndexFile + " says '" + want + "'");
  }
}

const io::TensorInfo& require_tensor(const io::SafetensorsFile& f, const std::string& name, io::Dtype dtype,
                                     const std::vector<std::int64_t>& shape, const std::string& what) {
  const io::TensorInfo* t = f.find(name);
  if (!t) fail(ErrorKind::bad_file, f.path() + ": tensor '" + name + "' (" + what + ") is missing");
  if (t->dtype != dtype)
    fail(ErrorKind::bad_file, f.path() + ": tensor '" + name + "' (" + what + ") has dtype " + io::dtype_name(t->dtype) + ", expected " +
                                  io::dtype_name(dtype));
  if (t->shape != shape)
    fail(ErrorKind::bad_file, f.path() + ": tensor '" + name + "' (" + what + ") has shape " + io::shape_string(t->shape) + ", expected " +
                                  io::shape_string(shape));
  return *t;
}

void check_codes(const io::SafetensorsFile& f, const io::TensorInfo& t, WeightType type, int k) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(f.data(t));
  if (type == WeightType::int8) {
    if (const void* hit = std::memchr(bytes, 0x80, t.nbytes))
      fail(ErrorKind::bad_file, f.path() + ": tensor '" + t.name + "' holds the code -128 at element " +
                                    std::to_string(static_cast<const unsigned char*>(hit) - bytes) + "; int8 codes are -127..127");
    return;
  }
  if (k % 2 == 0) return;
  // An odd row length leaves the high nibble of each row's last byte unused: it must be 0, so
  // that a kernel reading whole bytes adds nothing from it.
  const std::size_t row_bytes = static_cast<std::size_t>(t.shape[1]);
  for (std::int64_t r = 0; r < t.shape[0]; ++r)
    if (bytes[row_bytes * r + row_bytes - 1] >> 4)
      fail(ErrorKind::bad_file, f.path() + ": tensor '" + t.name + "' row " + std::to_string(r) +
                                    ": the padding nibble after the last input is not 0");
}

void check_scales(const io::SafetensorsFile& f, const io::TensorInfo& t, WeightType type, const float* v, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    if (!std::isfinite(v[i]) || v[i] < 0.0f)
      fail(ErrorKind::bad_file, f.path() + ": tensor '" + t.name + "' element " + std::to_string(i) + " is " + std::to_string(v[i]) +
                                    "; scales must be finite and >= 0");
    if (type == WeightType::mxfp4 && !valid_mxfp4_scale(v[i]))
      fail(ErrorKind::bad_file, f.path() + ": tensor '" + t.name + "' element " + std::to_string(i) + " is " + std::to_string(v[i]) +
                                    "; mxfp4 scales are powers of two in [2^-125, 2^125]");
  }
}

// Reads node `node`'s file of `layer` into `dst`, whose intermediate columns start at
// `offset` of the layer (0 when dst is that node's slice alone). `first` says whether the down
// scales of int8 (each row's, the same in every node's file) are written or compared.
void read_node(const std::string& dir, const QuantizedModelInfo& info, int layer, int node, QuantizedExperts& dst, int offset, bool first) {
  const auto f = io::SafetensorsFile::open(dir + "/" + info.files.at(layer)[node]);
  check_metadata(f, info, layer, node);
  const IntermediateSlice s = info.slices[node];
  const MoeShape part = format::slice_shape(info.shape, s);
  const io::Dtype codes_dtype = format::code_dtype(info.type);
  std::set<std::string> expected;
  std::vector<float> down_scales;
  for (Projection p : kProjections) {
    QuantizedProjection& qp = dst[p];
    const int k = projection_in(part, p);
    for (int e = 0; e < info.shape.num_experts; ++e) {
      const std::string base = expert_tensor_base(info.name_templates[static_cast<int>(p)], layer, e);
      const std::string what = "layer " + std::to_string(layer) + " expert " + std::to_string(e) + " " + projection_name(p);
      const auto& codes = require_tensor(f, base + ".qweight", codes_dtype, format::qweight_shape(info.type, part, p), what + " codes");
      const auto& scales = require_tensor(f, base + ".scales", io::Dtype::F32,
                                          format::scales_shape(info.type, info.group, part, p), what + " scales");
      expected.insert(codes.name);
      expected.insert(scales.name);
      check_codes(f, codes, info.type, k);
      const std::size_t scale_count = scales.nbytes / sizeof(float);
      if (p != Projection::down) {  // rows [offset, offset + width): contiguous
        std::memcpy(qp.codes_of(e) + qp.row_bytes() * offset, f.data(codes), codes.nbytes);
        float* to = qp.scales_of(e) + static_cast<std::size_t>(qp.groups_per_row()) * offset;
        std::memcpy(to, f.data(scales), scales.nbytes);
        check_scales(f, scales, info.type, to, scale_count);
        continue;
      }
      const std::size_t row_bytes = static_cast<std::size_t>(codes.shape[1]);
      const std::size_t byte0 = is_four_bit_weight_type(info.type) ? offset / 2 : offset;
      for (int r = 0; r < qp.n; ++r)
        std::memcpy(qp.codes_of(e) + qp.row_bytes() * r + byte0, f.data(codes) + row_bytes * r, row_bytes);
      down_scales.resize(scale_count);
      std::memcpy(down_scales.data(), f.data(scales), scales.nbytes);
      check_scales(f, scales, info.type, down_scales.data(), scale_count);
      if (info.type == WeightType::int8) {
        if (first) std::copy(down_scales.begin(), down_scales.end(), qp.scales_of(e));
        else if (!std::equal(down_scales.begin(), down_scales.end(), qp.scales_of(e)))
          fail(ErrorKind::bad_file, f.path() + ": tensor '" + scales.name + "' differs from node 0's; int8 down scales are each row's " +
                                        "and the same in every node's file");
        continue;
      }
      const std::size_t groups = static_cast<std::size_t>(scales.shape[1]), group0 = offset / info.group;
      for (int r = 0; r < qp.n; ++r)
        std::copy_n(down_scales.data() + groups * r, groups, qp.scales_of(e) + static_cast<std::size_t>(qp.groups_per_row()) * r + group0);
    }
  }
  if (f.tensors().size() != expected.size())
    for (const auto& t : f.tensors())
      if (!expected.count(t.name))
        fail(ErrorKind::bad_file, f.path() + ": unexpected tensor '" + t.name + "' (the file holds layer " + std::to_string(layer) +
                                      "'s expert codes and scales only)");
}

}  // namespace

QuantizedExperts load_quantized_layer(const std::string& dir, int layer, const MoeShape& expected, const std::string& source_hash) {
  const QuantizedModelInfo info = read_quantized_info(dir);
  check_fits_model(info, dir, layer, expected, source_hash);
  QuantizedExperts q = allocate_experts(info, info.shape);
  // The file stores the experts' weights, not their activation: that is the model's.
  q.shape.swiglu_limit = expected.swiglu_limit;
  q.shape.swiglu_alpha = expected.swiglu_alpha;
  q.shape.swiglu_up_offset = expected.swiglu_up_offset;
  for (int node = 0; node < info.numa_nodes(); ++node) read_node(dir, info, layer, node, q, info.slices[node].begin, node == 0);
  return q;
}

QuantizedExperts load_quantized_layer_slice(const std::string& dir, int layer, int node, const MoeShape& expected,
                                            const std::string& source_hash) {
  const QuantizedModelInfo info = read_quantized_info(dir);
  check_fits_model(info, dir, layer, expected, source_hash);
  if (node < 0 || node >= info.numa_nodes())
    fail(ErrorKind::invalid_argument, dir + "/" + kQuantizedIndexFile + ": node " + std::to_string(node) + " does not exist (numa_nodes " +
                                          std::to_string(info.numa_nodes()) + ")");
  QuantizedExperts q = allocate_experts(info, format::slice_shape(info.shape, info.slices[node]));
  q.shape.swiglu_limit = expected.swiglu_limit;
  q.shape.swiglu_alpha = expected.swiglu_alpha;
  q.shape.swiglu_up_offset = expected.swiglu_up_offset;
  read_node(dir, info, layer, node, q, 0, true);
  return q;
}

}  // namespace tilemoe::quant
