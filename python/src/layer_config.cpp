#include "layer_config.hpp"

#include <string>

#include "errors.hpp"

namespace tilemoe::binding {
namespace {

py::object field(py::handle config, const char* name) {
  if (!py::hasattr(config, name))
    type_error(std::string("config: expected a tilemoe.MoEConfig, got an object without '") + name + "'");
  return config.attr(name);
}

int int_field(py::handle config, const char* name) {
  py::object v = field(config, name);
  if (!py::isinstance<py::int_>(v) || py::isinstance<py::bool_>(v))
    type_error(std::string("MoEConfig.") + name + ": expected an int, got " +
               py::str(py::type::handle_of(v).attr("__name__")).cast<std::string>());
  long long x = v.cast<long long>();
  if (x < -(1LL << 31) || x >= (1LL << 31)) value_error(std::string("MoEConfig.") + name + ": " + std::to_string(x) + " is out of range");
  return static_cast<int>(x);
}

WeightType weight_type_of(py::handle config) {
  py::object v = field(config, "weight_type");
  if (!py::isinstance<py::str>(v)) type_error("MoEConfig.weight_type: expected 'bf16', 'int8', 'int4' or 'mxfp4'");
  std::string s = v.cast<std::string>();
  if (s == "bf16") return WeightType::bf16;
  if (s == "int8") return WeightType::int8;
  if (s == "int4") return WeightType::int4;
  if (s == "mxfp4") return WeightType::mxfp4;
  value_error("MoEConfig.weight_type: '" + s + "'; expected 'bf16', 'int8', 'int4' or 'mxfp4'");
}

const char* weight_type_str(WeightType t) {
  switch (t) {
    case WeightType::bf16: return "bf16";
    case WeightType::int8: return "int8";
    case WeightType::int4: return "int4";
    case WeightType::mxfp4: return "mxfp4";
  }
  return "bf16";
}

}  // namespace

LayerSetup layer_setup_from_py(py::handle config) {
  LayerSetup s;
  MoeLayerConfig& c = s.config;
  c.num_experts = int_field(config, "num_experts");
  c.top_k = int_field(config, "top_k");
  c.hidden = int_field(config, "hidden");
  c.intermediate = int_field(config, "intermediate");
  c.max_tokens = int_field(config, "max_tokens");
  c.lora_rank = int_field(config, "lora_rank");
  py::object alpha = field(config, "lora_alpha");
  if (alpha.is_none()) {
    c.lora_alpha = c.lora_rank;  // scale 1, MoEConfig's documented default
  } else {
    if (!py::isinstance<py::float_>(alpha) && !py::isinstance<py::int_>(alpha)) type_error("MoEConfig.lora_alpha: expected a float");
    c.lora_alpha = alpha.cast<double>();
  }
  c.use_rslora = py::bool_(field(config, "use_rslora"));
  c.max_cache_depth = int_field(config, "max_cache_depth");
  c.weight_type = weight_type_of(config);
  c.group_size = int_field(config, "group_size");
  c.numa_nodes = int_field(config, "numa_nodes");
  c.backward_weight_copy = py::bool_(field(config, "backward_weight_copy"));
  c.swiglu_limit = field(config, "swiglu_limit").cast<double>();  // typed by MoEConfig, ranged by the runtime
  c.swiglu_alpha = field(config, "swiglu_alpha").cast<double>();
  c.swiglu_up_offset = field(config, "swiglu_up_offset").cast<double>();
  py::object threads = field(config, "threads");
  s.threads = threads.is_none() ? 0 : int_field(config, "threads");
  return s;
}

py::object config_to_py(const MoeLayerConfig& c, int threads) {
  py::object cls = py::module_::import("tilemoe.config").attr("MoEConfig");
  return cls(py::arg("num_experts") = c.num_experts, py::arg("top_k") = c.top_k, py::arg("hidden") = c.hidden,
             py::arg("intermediate") = c.intermediate, py::arg("max_tokens") = c.max_tokens, py::arg("lora_rank") = c.lora_rank,
             py::arg("lora_alpha") = c.lora_alpha, py::arg("use_rslora") = c.use_rslora,
             py::arg("max_cache_depth") = c.max_cache_depth, py::arg("weight_type") = weight_type_str(c.weight_type), py::arg("group_size") = c.group_size,
             py::arg("numa_nodes") = c.numa_nodes, py::arg("threads") = threads,
             py::arg("backward_weight_copy") = c.backward_weight_copy, py::arg("swiglu_limit") = c.swiglu_limit,
             py::arg("swiglu_alpha") = c.swiglu_alpha, py::arg("swiglu_up_offset") = c.swiglu_up_offset);
}

}  // namespace tilemoe::binding
