#include "src/model/checkpoint.hpp"

#include <array>
#include <cmath>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "numa/thread_pool.hpp"
#include "src/model/finite_check.hpp"
#include "src/model/tensor_names.hpp"
#include "tilemoe/error.hpp"
#include "tilemoe/mxfp4.hpp"

namespace tilemoe {
namespace fs = std::filesystem;

namespace {

std::vector<std::string> shard_files(const std::string& dir) {
  fs::path index = fs::path(dir) / "model.safetensors.index.json";
  if (fs::exists(index)) {
    std::ifstream in(index);
    std::stringstream ss;
    ss << in.rdbuf();
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(ss.str());
    } catch (const nlohmann::json::exception& e) {
      fail(ErrorKind::bad_file, index.string() + ": not valid JSON (" + e.what() + ")");
    }
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      fail(ErrorKind::bad_file, index.string() + ": no 'weight_map' object");
    std::set<std::string> files;
    for (auto& [key, file] : j["weight_map"].items()) {
      if (!file.is_string()) fail(ErrorKind::bad_file, index.string() + ": weight_map entry '" + key + "' is not a file name");
      std::string f = file.get<std::string>();
      if (f.find('/') != std::string::npos || f == "..")
        fail(ErrorKind::bad_file, index.string() + ": weight_map entry '" + key + "' points outside the directory");
      files.insert(f);
    }
    std::vector<std::string> out;
    for (const auto& f : files) {
      fs::path p = fs::path(dir) / f;
      if (!fs::exists(p)) fail(ErrorKind::bad_file, index.string() + ": lists shard '" + f + "', which does not exist");
      out.push_back(p.string());
    }
    return out;
  }
  fs::path single = fs::path(dir) / "model.safetensors";
  if (fs::exists(single)) return {single.string()};
  std::vector<std::string> out;
  if (fs::is_directory(dir))
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().extension() == ".safetensors") out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  if (out.empty()) fail(ErrorKind::bad_file, dir + ": no model.safetensors, no model.safetensors.index.json and no *.safetensors");
  return out;
}

// DeepSeek-V3's FP8 checkpoints store e4m3 weights with one inverse scale per block of
// block_rows x block_cols (128 x 128); the last block of a row or column is partial when the
// shape is not a multiple of the block.
void dequantize_fp8_blocks(const std::uint8_t* q, int rows, int cols, const std::vector<float>& scale_inv, int block_rows,
                           int block_cols, bf16* out) {
  const std::size_t scale_cols = static_cast<std::size_t>((cols + block_cols - 1) / block_cols);
  for (int r = 0; r < rows; ++r) {
    const float* scale_row = scale_inv.data() + static_cast<std::size_t>(r / block_rows) * scale_cols;
    for (int c = 0; c < cols; ++c)
      out[static_cast<std::size_t>(r) * cols + c] =
          float_to_bf16(f8e4m3_to_float(q[static_cast<std::size_t>(r) * cols + c]) * scale_row[c / block_cols]);
  }
}

}  // namespace

Checkpoint Checkpoint::open(const std::string& model_dir) {
  if (!fs::is_directory(model_dir)) fail(ErrorKind::bad_file, model_dir + ": not a directory (--model takes a checkpoint directory)");
  Checkpoint ck;
  ck.dir_ = model_dir;
  ck.config_ = read_model_config(model_dir);
  for (const auto& path : shard_files(model_dir)) {
    ck.files_.push_back(std::make_unique<io::SafetensorsFile>(io::SafetensorsFile::open(path)));
    int idx = static_cast<int>(ck.files_.size()) - 1;
    for (const auto& t : ck.files_.back()->tensors()) {
      auto [it, inserted] = ck.location_.emplace(t.name, Location{idx, &t});
      if (!inserted)
        fail(ErrorKind::bad_file, path + ": tensor '" + t.name + "' is also in " + ck.files_[it->second.file]->path());
    }
  }
  return ck;
}

const Checkpoint::Location* Checkpoint::find(const std::string& name) const {
  auto it = location_.find(name);
  return it == location_.end() ? nullptr : &it->second;
}

void Checkpoint::check_moe_layer(int layer) const {
  if (!config_.is_moe_layer(layer))
    fail(ErrorKind::invalid_argument, dir_ + ": layer " + std::to_string(layer) + " is not a MoE layer (MoE layers: " +
                                          config_.moe_layers_string() + ")");
}

void Checkpoint::read_expert_tensor(const ExpertTensorRef& ref, int rows, int cols, const std::string& what, bf16* out) const {
  const std::string& name = ref.name;
  const Location* loc = find(name);
  const auto& file = *files_[loc->file];
  const auto& info = *loc->info;
  if (ref.transposed || !ref.scales.empty()) return read_gpt_oss_tensor(ref, rows, cols, out);
  if (ref.stacked()) {  // shape and dtype checked by add_stacked_experts
    const std::size_t elem = io::dtype_size(info.dtype);
    const std::size_t first = (static_cast<std::size_t>(ref.stacked_expert) * static_cast<std::size_t>(info.shape[1]) +
                               static_cast<std::size_t>(ref.first_row)) * static_cast<std::size_t>(cols) * elem;
    io::convert_to_bf16(info.dtype, file.data(info) + first, static_cast<std::size_t>(rows) * cols, out);
    file.release(info.offset + first, ref.bytes);
    return;
  }
  if (info.shape.size() != 2 || info.shape[0] != rows || info.shape[1] != cols)
    fail(ErrorKind::bad_file, file.path() + ": " + what + " ('" + name + "') has shape " + io::shape_string(info.shape) +
                                  ", expected [" + std::to_string(rows) + ", " + std::to_string(cols) + "] from config.json");
  if (info.dtype == io::Dtype::F8_E4M3) {
    std::string scale_name = name + "_scale_inv";
    const Location* s = find(scale_name);
    if (!s) fail(ErrorKind::bad_file, file.path() + ": " + what + " ('" + name + "') is FP8 but '" + scale_name + "' is missing");
    const auto& sinfo = *s->info;
    const int br = config_.fp8_block_rows, bc = config_.fp8_block_cols;
    const std::int64_t want_rows = (rows + br - 1) / br, want_cols = (cols + bc - 1) / bc;
    if (sinfo.shape.size() != 2 || sinfo.shape[0] != want_rows || sinfo.shape[1] != want_cols)
      fail(ErrorKind::bad_file, files_[s->file]->path() + ": '" + scale_name + "' has shape " + io::shape_string(sinfo.shape) +
                                    ", expected [" + std::to_string(want_rows) + ", " + std::to_string(want_cols) +
                                    "]: one scale per " + std::to_string(br) + "x" + std::to_string(bc) + " block of the [" +
                                    std::to_string(rows) + ", " + std::to_string(cols) + "] weight");
    auto scale = io::read_as_f32(*files_[s->file], scale_name);
    dequantize_fp8_blocks(reinterpret_cast<const std::uint8_t*>(file.data(info)), rows, cols, scale, br, bc, out);
    file.release(info.offset, info.nbytes);
    return;
  }
  if (info.dtype != io::Dtype::BF16 && info.dtype != io::Dtype::F16 && info.dtype != io::Dtype::F32)
    fail(ErrorKind::bad_file, file.path() + ": " + what + " ('" + name + "') has dtype " + io::dtype_name(info.dtype) +
                                  "; expert weights must be BF16, F16, F32 or F8_E4M3");
  io::convert_to_bf16(info.dtype, file.data(info), static_cast<std::size_t>(rows) * cols, out);
  file.release(info.offset, info.nbytes);
}

namespace {

std::string projection_tokens(Projection p) {
  return p == Projection::gate ? "gate_proj|w1" : p == Projection::up ? "up_proj|w3" : "down_proj|w2";
}

// Router weights as stored: "...gate.weight" (DeepSeek, Qwen-MoE, Mixtral, ERNIE), "...gate.wg.weight"
// (Hunyuan), "...router.layer.weight" (GraniteMoE).
bool is_router_name(const std::string& name) {
  for (std::string_view suffix : {".gate.weight", ".gate.wg.weight", ".router.layer.weight"})
    if (name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) return true;
  return false;
}

std::string bias_refusal(const std::string& where, const std::string& name) {
  return where + " has a bias ('" + name + "'); expert projections with a bias are not supported (tilemoe computes W x, as the "
                                          "experts of DeepSeek, Qwen-MoE and Mixtral do)";
}

}  // namespace

void Checkpoint::add_stacked_experts(int layer, const std::string& name, const Location& loc,
                                     std::array<std::vector<ExpertTensorRef>, 3>& refs) const {
  const auto parsed = parse_stacked_expert_tensor_name(name);
  const MoeShape& s = config_.shape;
  const auto& info = *loc.info;
  const std::string path = files_[loc.file]->path();
  const std::string where = path + ": layer " + std::to_string(layer) + " experts";
  if (parsed->bias) fail(ErrorKind::unsupported, bias_refusal(where, name));
  // The projections this tensor holds, each with its first row in an expert's matrix.
  std::vector<std::pair<Projection, int>> parts;
  switch (parsed->kind) {
    case StackedExperts::gate_up: parts = {{Projection::gate, 0}, {Projection::up, s.intermediate}}; break;
    case StackedExperts::gate: parts = {{Projection::gate, 0}}; break;
    case StackedExperts::up: parts = {{Projection::up, 0}}; break;
    case StackedExperts::down: parts = {{Projection::down, 0}}; break;
  }
  const Projection first = parts.front().first;
  const std::int64_t rows = static_cast<std::int64_t>(projection_out(s, first)) * static_cast<std::int64_t>(parts.size());
  const std::int64_t cols = projection_in(s, first);
  const std::string want =
      std::string("[") + std::to_string(s.num_experts) + ", " + std::to_string(rows) + ", " + std::to_string(cols) + "]";
  if (info.shape.size() != 3)
    fail(ErrorKind::bad_file, where + ": '" + name + "' has shape " + io::shape_string(info.shape) + ", expected " + want +
                                  " (every expert's " + parsed->projection_token + " stacked)");
  if (info.shape[0] != s.num_experts)
    fail(ErrorKind::bad_file, where + ": '" + name + "' stacks " + std::to_string(info.shape[0]) + " experts but config.json says " +
                                  std::to_string(s.num_experts));
  if (info.shape[1] != rows || info.shape[2] != cols) {
    if (info.shape[1] == cols && info.shape[2] == rows)
      fail(ErrorKind::unsupported, where + ": '" + name + "' has shape " + io::shape_string(info.shape) +
                                       ", experts stored as [in, out] for x W (as gpt-oss and Llama 4 store them); stacked experts are "
                                       "read as transformers v5 stores DeepSeek, Qwen-MoE and Mixtral, " + want + " for W x");
    fail(ErrorKind::bad_file, where + ": '" + name + "' has shape " + io::shape_string(info.shape) + ", expected " + want +
                                  " from config.json");
  }
  if (info.dtype == io::Dtype::F8_E4M3)
    fail(ErrorKind::unsupported, where + ": '" + name + "' is FP8 in a tensor that stacks the experts; FP8 is read from per-expert "
                                     "tensors with their weight_scale_inv (as DeepSeek-V3 ships them)");
  if (info.dtype != io::Dtype::BF16 && info.dtype != io::Dtype::F16 && info.dtype != io::Dtype::F32)
    fail(ErrorKind::bad_file, where + ": '" + name + "' has dtype " + io::dtype_name(info.dtype) +
                                  "; expert weights must be BF16, F16, F32 or F8_E4M3");
  const std::size_t bytes =
      static_cast<std::size_t>(projection_out(s, first)) * static_cast<std::size_t>(cols) * io::dtype_size(info.dtype);
  ExpertTensorRef stacked;
  stacked.name = name;
  stacked.stacked_expert = 0;
  stacked.bytes = bytes;
  place_stacked_refs(layer, stacked, parts, refs);
}

void Checkpoint::place_stacked_refs(int layer, const ExpertTensorRef& like, const std::vector<std::pair<Projection, int>>& parts,
                                    std::array<std::vector<ExpertTensorRef>, 3>& refs) const {
  for (int e = 0; e < config_.shape.num_experts; ++e)
    for (const auto& [p, first_row] : parts) {
      auto& slot = refs[static_cast<int>(p)][e];
      if (!slot.name.empty())
        fail(ErrorKind::bad_file, dir_ + ": layer " + std::to_string(layer) + " expert " + std::to_string(e) + " " + projection_name(p) +
                                      ": stored twice, as '" + slot.name + "' and in '" + like.name + "'");
      slot = like;
      slot.stacked_expert = e;
      slot.first_row = first_row;
    }
}

namespace {

// One row of MXFP4 (tilemoe/mxfp4.hpp) as bf16; every value is exact where its exponent keeps it a
// normal bf16.
void dequantize_mxfp4_row(const std::uint8_t* codes, const std::uint8_t* exponents, int cols, bf16* out) {
  for (int g = 0; g < cols / kMxfp4Group; ++g) {
    const float scale = std::ldexp(1.0f, static_cast<int>(exponents[g]) - kMxfp4ExponentBias);
    for (std::size_t j = 0; j < kMxfp4GroupBytes; ++j) {
      const std::uint8_t byte = codes[g * kMxfp4GroupBytes + j];
      out[g * kMxfp4Group + 2 * j] = float_to_bf16(kE2m1Values[byte & 0x0f] * scale);
      out[g * kMxfp4Group + 2 * j + 1] = float_to_bf16(kE2m1Values[byte >> 4] * scale);
    }
  }
}

}  // namespace

void Checkpoint::add_gpt_oss_experts(int layer, const std::string& name, const Location& loc, bool mxfp4,
                                     std::array<std::vector<ExpertTensorRef>, 3>& refs) const {
  const MoeShape& s = config_.shape;
  const auto& info = *loc.info;
  const std::string where = files_[loc.file]->path() + ": layer " + std::to_string(layer) + " experts";
  const bool gate_up = name.find("gate_up_proj") != std::string::npos;
  const std::int64_t out = gate_up ? 2 * static_cast<std::int64_t>(s.intermediate) : s.hidden;
  const std::int64_t in = gate_up ? s.hidden : s.intermediate;
  std::string scales;
  if (mxfp4) {
    scales = name.substr(0, name.size() - 7) + "_scales";  // "..._blocks" -> "..._scales"
    const Location* sl = find(scales);
    if (!sl) fail(ErrorKind::bad_file, where + ": '" + name + "' is MXFP4 blocks but '" + scales + "' is missing");
    const std::int64_t groups = in / kMxfp4Group;
    const std::vector<std::int64_t> want_blocks{s.num_experts, out, groups, static_cast<std::int64_t>(kMxfp4GroupBytes)},
        want_scales{s.num_experts, out, groups};
    if (in % kMxfp4Group != 0)
      fail(ErrorKind::bad_file, where + ": '" + name + "' is MXFP4, whose blocks of 32 do not divide the input size " + std::to_string(in));
    if (info.dtype != io::Dtype::U8 || info.shape != want_blocks)
      fail(ErrorKind::bad_file, where + ": '" + name + "' is " + io::dtype_name(info.dtype) + " " + io::shape_string(info.shape) +
                                    ", expected U8 " + io::shape_string(want_blocks) + " (MXFP4 blocks of config.json's shape)");
    if (sl->info->dtype != io::Dtype::U8 || sl->info->shape != want_scales)
      fail(ErrorKind::bad_file, files_[sl->file]->path() + ": '" + scales + "' is " + io::dtype_name(sl->info->dtype) + " " +
                                    io::shape_string(sl->info->shape) + ", expected U8 " + io::shape_string(want_scales) +
                                    " (one E8M0 scale per block of 32)");
  } else {
    const std::vector<std::int64_t> want{s.num_experts, in, out};
    if (info.shape != want)
      fail(ErrorKind::bad_file, where + ": '" + name + "' has shape " + io::shape_string(info.shape) + ", expected " +
                                    io::shape_string(want) + " (gpt-oss stores its experts as x W, [experts, in, out])");
    if (info.dtype != io::Dtype::BF16 && info.dtype != io::Dtype::F16 && info.dtype != io::Dtype::F32)
      fail(ErrorKind::bad_file, where + ": '" + name + "' has dtype " + io::dtype_name(info.dtype) +
                                    "; gpt-oss experts are read as BF16, F16, F32 or MXFP4 (*_blocks and *_scales)");
  }
  std::vector<std::pair<Projection, int>> parts;
  if (gate_up) parts = {{Projection::gate, 0}, {Projection::up, 1}};  // interleaved: gate's even outputs, up's odd
  else parts = {{Projection::down, 0}};
  const std::size_t values = static_cast<std::size_t>(projection_out(s, parts.front().first)) * static_cast<std::size_t>(in);
  const std::size_t bytes = mxfp4 ? values / 2 + values / kMxfp4Group : values * io::dtype_size(info.dtype);
  place_stacked_refs(layer, ExpertTensorRef{name, 0, 0, bytes, gate_up ? 2 : 1, !mxfp4, scales}, parts, refs);
}

void Checkpoint::read_gpt_oss_tensor(const ExpertTensorRef& ref, int rows, int cols, bf16* out) const {
  const Location* loc = find(ref.name);
  const auto& file = *files_[loc->file];
  const auto& info = *loc->info;
  const std::size_t e = static_cast<std::size_t>(ref.stacked_expert);
  if (!ref.scales.empty()) {
    const Location* sl = find(ref.scales);
    const auto& sinfo = *sl->info;
    const Mxfp4StackRows stack{static_cast<std::size_t>(info.shape[1]), static_cast<std::size_t>(cols / kMxfp4Group), ref.first_row,
                               ref.row_step};
    const auto* codes = reinterpret_cast<const std::uint8_t*>(file.data(info));
    const auto* exponents = reinterpret_cast<const std::uint8_t*>(files_[sl->file]->data(sinfo));
    for (int i = 0; i < rows; ++i) {
      const auto row = static_cast<std::size_t>(i);
      dequantize_mxfp4_row(codes + stack.code_offset(e, row), exponents + stack.exponent_offset(e, row), cols,
                           out + row * static_cast<std::size_t>(cols));
    }
    // As read_expert_tensor does, the expert's pages leave this process's memory once read: by the
    // last projection that reads them (up of an interleaved gate_up; gate's reader, running beside
    // it, faults back in what it still needs).
    if (ref.first_row + 1 == ref.row_step) {
      file.release(info.offset + e * stack.expert_code_bytes(), stack.expert_code_bytes());
      files_[sl->file]->release(sinfo.offset + e * stack.expert_exponent_bytes(), stack.expert_exponent_bytes());
    }
    return;
  }
  // x W: [E, in, out]; this projection's W x row i is column first_row + i * row_step.
  const std::size_t total_cols = static_cast<std::size_t>(info.shape[2]), elem = io::dtype_size(info.dtype);
  std::vector<bf16> row(total_cols);
  for (int k = 0; k < cols; ++k) {
    const std::size_t at = (e * static_cast<std::size_t>(cols) + static_cast<std::size_t>(k)) * total_cols * elem;
    io::convert_to_bf16(info.dtype, file.data(info) + at, total_cols, row.data());
    for (int i = 0; i < rows; ++i)
      out[static_cast<std::size_t>(i) * cols + k] = row[static_cast<std::size_t>(ref.first_row) + static_cast<std::size_t>(i) * ref.row_step];
  }
  if (ref.first_row + 1 == ref.row_step)  // the last projection reading the expert (as above)
    file.release(info.offset + e * static_cast<std::size_t>(cols) * total_cols * elem, static_cast<std::size_t>(cols) * total_cols * elem);
}

void Checkpoint::load_layer_biases(int layer, ExpertWeights& w) const {
  w.gate_bias.clear(), w.up_bias.clear(), w.down_bias.clear();
  if (!config_.gpt_oss_layout) return;
  const MoeShape& s = config_.shape;
  std::string gate_up, down;
  for (const auto& [name, loc] : location_) {
    const auto parsed = parse_stacked_expert_tensor_name(name);
    if (!parsed || !parsed->bias || parsed->layer != layer) continue;
    (parsed->kind == StackedExperts::gate_up ? gate_up : down) = name;
  }
  const std::string looked = dir_ + ": layer " + std::to_string(layer) + " experts: gpt-oss's ";
  if (gate_up.empty()) fail(ErrorKind::bad_file, looked + "gate_up_proj_bias is missing (looked for '...layers." + std::to_string(layer) + "...experts.gate_up_proj_bias')");
  if (down.empty()) fail(ErrorKind::bad_file, looked + "down_proj_bias is missing (looked for '...layers." + std::to_string(layer) + "...experts.down_proj_bias')");
  const std::vector<bf16> gu = io::read_as_bf16(*file_of(gate_up), gate_up, std::vector<std::int64_t>{s.num_experts, 2 * static_cast<std::int64_t>(s.intermediate)});
  w.down_bias = io::read_as_bf16(*file_of(down), down, std::vector<std::int64_t>{s.num_experts, s.hidden});
  const std::size_t ei = static_cast<std::size_t>(s.num_experts) * s.intermediate;
  w.gate_bias.resize(ei);
  w.up_bias.resize(ei);
  for (std::size_t i = 0; i < ei; ++i) w.gate_bias[i] = gu[2 * i], w.up_bias[i] = gu[2 * i + 1];
  require_finite(gu.data(), gu.size(), file_of(gate_up)->path() + ": layer " + std::to_string(layer) + " experts' gate_up bias ('" + gate_up + "')");
  require_finite(w.down_bias.data(), w.down_bias.size(), file_of(down)->path() + ": layer " + std::to_string(layer) + " experts' down bias ('" + down + "')");
}

std::array<std::vector<ExpertTensorRef>, 3> Checkpoint::expert_tensors(int layer) const {
  check_moe_layer(layer);
  const MoeShape& s = config_.shape;
  std::array<std::vector<ExpertTensorRef>, 3> refs;
  for (auto& v : refs) v.resize(s.num_experts);
  // GPTQ, AWQ, bitsandbytes... store experts under other names (qweight, ...): say so where their
  // weights are not found.
  auto quantized_hint = [&]() -> std::string {
    if (config_.quant_method.empty() || config_.quant_method == "fp8") return "";
    return "; config.json's quantization_config has quant_method '" + config_.quant_method +
           "', and only BF16, F16, F32 and block-scaled FP8 (E4M3) expert weights are read (for int8 or int4 experts, quantize "
           "a BF16 checkpoint: `tilemoe quantize`, or --weights int8|int4)";
  };
  // Stacked tensors first, so that a per-expert tensor stored beside one is reported as stored twice
  // whatever the order of the names.
  struct PerExpert {
    const std::string* name;
    const Location* loc;
    ExpertTensorName parsed;
  };
  std::vector<PerExpert> per_expert;
  for (const auto& [name, loc] : location_) {
    if (config_.gpt_oss_layout) {
      // x W tensors, or MXFP4's "..._blocks" (with "..._scales" beside); biases: load_layer_biases.
      constexpr std::string_view kBlocks = "_blocks";
      const bool mxfp4 = name.size() > kBlocks.size() && name.compare(name.size() - kBlocks.size(), kBlocks.size(), kBlocks) == 0;
      const auto stacked = parse_stacked_expert_tensor_name(mxfp4 ? std::string_view(name).substr(0, name.size() - kBlocks.size()) : name);
      if (stacked && stacked->layer == layer && !stacked->bias &&
          (stacked->kind == StackedExperts::gate_up || stacked->kind == StackedExperts::down))
        add_gpt_oss_experts(layer, name, loc, mxfp4, refs);
      if (stacked && stacked->layer == layer) continue;
    }
    if (auto stacked = parse_stacked_expert_tensor_name(name)) {
      if (stacked->layer == layer) add_stacked_experts(layer, name, loc, refs);
      continue;
    }
    auto parsed = parse_expert_tensor_name(name);
    if (parsed && !parsed->lora && parsed->layer == layer) per_expert.push_back({&name, &loc, std::move(*parsed)});
  }
  for (const auto& [name_ptr, loc, parsed] : per_expert) {
    const std::string& name = *name_ptr;
    std::string where = dir_ + ": layer " + std::to_string(layer) + " expert " + std::to_string(parsed.expert) + " " +
                        projection_name(parsed.projection);
    if (parsed.bias)
      fail(ErrorKind::unsupported, bias_refusal(files_[loc->file]->path() + ": layer " + std::to_string(layer) + " expert " +
                                                    std::to_string(parsed.expert) + " " + projection_name(parsed.projection),
                                                name));
    if (parsed.expert >= s.num_experts)
      fail(ErrorKind::bad_file, where + ": '" + name + "' but config.json says " + std::to_string(s.num_experts) + " experts");
    auto& slot = refs[static_cast<int>(parsed.projection)][parsed.expert];
    if (!slot.name.empty()) fail(ErrorKind::bad_file, where + ": stored twice, as '" + slot.name + "' and '" + name + "'");
    slot = ExpertTensorRef{};
    slot.name = name;
    slot.bytes = loc->info->nbytes;
  }
  for (Projection p : kProjections)
    for (int e = 0; e < s.num_experts; ++e)
      if (refs[static_cast<int>(p)][e].name.empty())
        fail(ErrorKind::bad_file, dir_ + ": layer " + std::to_string(layer) + " expert " + std::to_string(e) + " " + projection_name(p) +
                                      " weight is missing (looked for '...layers." + std::to_string(layer) + "...experts." +
                                      std::to_string(e) + "." + projection_tokens(p) + ".weight' and for '...layers." +
                                      std::to_string(layer) + "...experts." +
                                      (p == Projection::down ? std::string("down_proj|w2") : "gate_up_proj|" + projection_tokens(p)) +
                                      "' stacking every expert)" + quantized_hint());
  return refs;
}

const io::SafetensorsFile* Checkpoint::file_of(const std::string& name) const {
  const Location* loc = find(name);
  return loc ? files_[loc->file].get() : nullptr;
}

ExpertWeights Checkpoint::load_layer_experts(int layer, const ProgressFn& progress) const {
  ExpertWeights w;
  load_layer_experts(layer, w, progress, nullptr);
  return w;
}

void Checkpoint::load_layer_experts(int layer, ExpertWeights& w, const ProgressFn& progress, numa::ThreadPool* pool) const {
  const MoeShape& s = config_.shape;
  const auto refs = expert_tensors(layer);
  std::size_t total_bytes = 0;
  for (const auto& list : refs)
    for (const auto& ref : list) total_bytes += ref.bytes;
  const std::size_t per = static_cast<std::size_t>(s.hidden) * s.intermediate;
  w.shape = s;
  for (auto* v : {&w.gate, &w.up, &w.down}) v->resize(per * s.num_experts);  // a no-op when reused
  std::atomic<std::size_t> done_bytes{0};
  auto one = [&](std::size_t item, int worker) {
    const Projection p = kProjections[item / s.num_experts];
    const int e = static_cast<int>(item % s.num_experts);
    const ExpertTensorRef& ref = refs[static_cast<int>(p)][e];
    const std::string what = "layer " + std::to_string(layer) + " expert " + std::to_string(e) + " " + projection_name(p);
    bf16* out = (p == Projection::gate ? w.gate : p == Projection::up ? w.up : w.down).data() + per * e;
    read_expert_tensor(ref, projection_out(s, p), projection_in(s, p), what, out);
    require_finite(out, per, files_[find(ref.name)->file]->path() + ": " + what + " ('" + ref.name + "'" +
                                 (ref.stacked() ? ", expert " + std::to_string(ref.stacked_expert) + " of the stack" : "") + ")");
    const std::size_t done = done_bytes += ref.bytes;
    if (progress && worker == 0) progress(done, total_bytes);
  };
  const std::size_t items = static_cast<std::size_t>(s.num_experts) * 3;
  if (pool) pool->parallel_for(items, one);
  else for (std::size_t i = 0; i < items; ++i) one(i, 0);
  load_layer_biases(layer, w);
  if (progress) progress(total_bytes, total_bytes);
}

std::vector<std::string> Checkpoint::router_tensor_names(int layer) const {
  check_moe_layer(layer);
  const MoeShape& s = config_.shape;
  const std::string* found = nullptr;
  for (const auto& [name, loc] : location_) {
    if (parse_layer_index(name) != layer) continue;
    // gpt-oss: "...mlp.router.weight".
    const bool named = is_router_name(name) || (config_.gpt_oss_layout && name.size() > 14 &&
                                                name.compare(name.size() - 14, 14, ".router.weight") == 0);
    bool router = named && name.find("experts") == std::string::npos && loc.info->shape.size() == 2 &&
                  loc.info->shape[0] == s.num_experts;
    if (router) {
      if (found) fail(ErrorKind::bad_file, dir_ + ": layer " + std::to_string(layer) + " has two routers: '" + *found + "' and '" + name + "'");
      found = &name;
    }
  }
  if (!found) fail(ErrorKind::bad_file, dir_ + ": layer " + std::to_string(layer) + " has no router weight ('...layers." +
                                           std::to_string(layer) + "...gate.weight', '...gate.wg.weight' or '...router.layer.weight' of shape [" +
                                           std::to_string(s.num_experts) + ", " + std::to_string(s.hidden) + "])");
  std::vector<std::string> names{*found};
  // The correction bias beside the router weight (DeepSeek-V3: "...mlp.gate.e_score_correction_bias"),
  // or on a module holding the router: the MoE block (MiniMax-M2: "...block_sparse_moe.e_score_correction_bias";
  // HY-V3 and AFMoE: "...mlp.expert_bias" beside "...mlp.router.gate.weight"), or the block's
  // moe_statics (ERNIE-4.5: "...mlp.moe_statics.e_score_correction_bias", [1, E]). The nearest wins.
  const std::string layer_module = ".layers." + std::to_string(layer);
  std::string module = found->substr(0, found->size() - 7);  // without ".weight"
  // DeepSeek-V4 (as transformers saves it, in DeepSeek's names) keeps it as the router's own bias,
  // "...ffn.gate.bias", never added to the logits.
  // gpt-oss's router bias, added to the logits (load_router reads it as such).
  if ((config_.model_type == "deepseek_v4" || config_.gpt_oss_layout) && find(module + ".bias")) {
    names.push_back(module + ".bias");
    return names;
  }
  // up to the layer's own module: a bias above it is not this layer's
  while (module.size() > layer_module.size() &&
         module.compare(module.size() - layer_module.size(), layer_module.size(), layer_module) != 0) {
    for (const char* bias : {".e_score_correction_bias", ".moe_statics.e_score_correction_bias", ".expert_bias"})
      if (find(module + bias)) {
        names.push_back(module + bias);
        return names;
      }
    const std::size_t dot = module.rfind('.');
    if (dot == std::string::npos) break;
    module.resize(dot);
  }
  return names;
}

RouterWeights Checkpoint::load_router(int layer) const {
  const MoeShape& s = config_.shape;
  const auto names = router_tensor_names(layer);
  RouterWeights r;
  std::vector<std::int64_t> shape{s.num_experts, s.hidden};
  r.weight = io::read_as_f32(*file_of(names[0]), names[0], shape);
  if (names.size() > 1 && config_.gpt_oss_layout) {
    r.logit_bias = io::read_as_f32(*file_of(names[1]), names[1], std::vector<std::int64_t>{s.num_experts});
  } else if (names.size() > 1) {
    std::vector<std::int64_t> bshape{s.num_experts};
    if (find(names[1])->info->shape.size() == 2) bshape.insert(bshape.begin(), 1);  // ERNIE-4.5's one group of experts
    r.correction_bias = io::read_as_f32(*file_of(names[1]), names[1], bshape);
  }
  return r;
}

}  // namespace tilemoe
