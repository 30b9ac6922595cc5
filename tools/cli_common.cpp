#include "tools/cli_common.hpp"

#include <iostream>

#include "src/io/safetensors.hpp"
#include "tilemoe/error.hpp"
#include "tools/progress_bar.hpp"

namespace tilemoe::cli {

void warn(const std::string& message) { std::cerr << "tilemoe: warning: " << message << "\n"; }

LayerInputs read_layer_inputs(const std::string& path, int hidden, bool need_grad_output) {
  auto f = io::SafetensorsFile::open(path);
  const auto& x = f.get("input");
  if (x.shape.size() != 2 || x.shape[1] != hidden)
    fail(ErrorKind::invalid_argument, path + ": 'input' has shape " + io::shape_string(x.shape) + ", expected [tokens, " +
                                          std::to_string(hidden) + "] (the model's hidden size)");
  if (x.dtype != io::Dtype::BF16 && x.dtype != io::Dtype::F32)
    fail(ErrorKind::invalid_argument, path + ": 'input' has dtype " + std::string(io::dtype_name(x.dtype)) + ", expected BF16 or F32");
  LayerInputs in;
  in.tokens = static_cast<int>(x.shape[0]);
  const auto& ids = f.get("expert_ids");
  if (ids.shape.size() != 2 || ids.shape[0] != in.tokens || ids.shape[1] < 1)
    fail(ErrorKind::invalid_argument, path + ": 'expert_ids' has shape " + io::shape_string(ids.shape) + ", expected [" +
                                          std::to_string(in.tokens) + ", top_k]");
  if (ids.dtype != io::Dtype::I64 && ids.dtype != io::Dtype::I32)
    fail(ErrorKind::invalid_argument, path + ": 'expert_ids' has dtype " + std::string(io::dtype_name(ids.dtype)) + ", expected I64 or I32");
  in.top_k = static_cast<int>(ids.shape[1]);
  std::vector<std::int64_t> routing_shape{in.tokens, in.top_k}, hidden_shape{in.tokens, hidden};
  in.input = io::read_as_f32(f, "input");
  in.expert_ids = io::read_as_i64(f, "expert_ids");
  in.weights = io::read_as_f32(f, "weights", routing_shape);
  if (need_grad_output) {
    const auto& g = f.get("grad_output");
    if (g.dtype != io::Dtype::BF16 && g.dtype != io::Dtype::F32)
      fail(ErrorKind::invalid_argument, path + ": 'grad_output' has dtype " + std::string(io::dtype_name(g.dtype)) + ", expected BF16 or F32");
    in.grad_output = io::read_as_f32(f, "grad_output", hidden_shape);
  }
  return in;
}

LoadedLayer load_layer(const std::string& model_dir, int layer, const std::string& adapter, bool load_experts) {
  auto ck = Checkpoint::open(model_dir);
  LoadedLayer l;
  l.config = ck.config();
  if (load_experts) {
    ProgressBar bar("loading layer " + std::to_string(layer));
    l.experts = ck.load_layer_experts(layer, bar.callback());
  }
  if (!adapter.empty()) {
    l.lora = load_layer_lora(adapter, l.config, layer);
    for (const auto& w : l.lora.warnings) warn(w);
  }
  return l;
}

}  // namespace tilemoe::cli
