// tilemoe.save_peft_adapter: the LoRA MoELayers use, written as one PEFT adapter directory
// (tilemoe/peft_save.hpp). The GIL stays held while it writes: no other Python thread can swap a
// layer's arrays (and free them) while they are read in place.
#include <tilemoe/error.hpp>
#include <tilemoe/peft_save.hpp>

#include <pybind11/stl.h>

#include "bindings.hpp"
#include "py_layer.hpp"
#include "scalar_args.hpp"

namespace tilemoe::binding {
namespace {

PeftSaveDtype save_dtype_arg(py::handle v) {
  if (v.is_none()) return PeftSaveDtype::as_held;
  const std::string s = str_arg(v, "dtype");
  if (s == "as_held") return PeftSaveDtype::as_held;
  if (s == "float32") return PeftSaveDtype::f32;
  if (s == "bfloat16") return PeftSaveDtype::bf16;
  throw Error(ErrorKind::invalid_argument, "save_peft_adapter: dtype '" + s + "' is not 'as_held', 'float32' or 'bfloat16'");
}

py::dict save_peft_adapter_py(py::object directory, py::object layers, py::object dtype, py::object experts_module,
                              py::object projection_names, py::object base_model_name_or_path) {
  std::vector<PeftSaveLayer> list;
  int i = 0;
  for (py::handle item : layers) {
    py::object layer = py::reinterpret_borrow<py::object>(item);
    std::optional<int> index;
    if (py::isinstance<py::tuple>(item)) {
      auto pair = py::reinterpret_borrow<py::tuple>(item);
      if (pair.size() != 2)
        throw Error(ErrorKind::invalid_argument, "save_peft_adapter: layers[" + std::to_string(i) + "] is a tuple of " +
                                                     std::to_string(pair.size()) + "; give a MoELayer or (MoELayer, index)");
      layer = pair[0];
      index = optional_int_arg(pair[1], "index");
    }
    if (!py::isinstance<PyLayer>(layer))
      throw Error(ErrorKind::invalid_argument, "save_peft_adapter: layers[" + std::to_string(i) + "] is a " +
                                                   std::string(py::str(layer.get_type().attr("__name__"))) + ", not a tilemoe.MoELayer");
    const PyLayer& l = layer.cast<const PyLayer&>();
    // A layer made from memory with layer_index knows its index on the Python side only.
    list.push_back({&l.layer(), index ? *index : l.origin().layer_index.value_or(-1)});
    ++i;
  }
  PeftSaveOptions o;
  o.dtype = save_dtype_arg(dtype);
  if (auto m = optional_str_arg(experts_module, "experts_module")) o.experts_module = *m;
  if (!projection_names.is_none()) {
    auto names = projection_names.cast<std::vector<std::string>>();
    if (names.size() != 3)
      throw Error(ErrorKind::invalid_argument, "save_peft_adapter: projection_names has " + std::to_string(names.size()) +
                                                   " names; give gate's, up's and down's");
    for (int p = 0; p < 3; ++p) o.projection_names[static_cast<std::size_t>(p)] = names[static_cast<std::size_t>(p)];
  }
  if (auto b = optional_str_arg(base_model_name_or_path, "base_model_name_or_path")) o.base_model_name_or_path = *b;
  const PeftSaveStats st = save_peft_adapter(str_arg(directory, "directory"), list, o);
  py::dict out;
  out["layers"] = st.layers;
  out["tensors"] = st.tensors;
  out["bytes"] = st.bytes;
  return out;
}

}  // namespace

void bind_save(py::module_& m) {
  m.def("save_peft_adapter", &save_peft_adapter_py, py::arg("directory"), py::arg("layers"), py::kw_only(), py::arg("dtype") = py::none(),
        py::arg("experts_module") = py::none(), py::arg("projection_names") = py::none(),
        py::arg("base_model_name_or_path") = py::none(),
        R"doc(Writes the LoRA the layers use now (the arrays given to update_lora_weights, or the adapter a layer
holds) as one PEFT adapter directory: adapter_config.json + adapter_model.safetensors. layers: MoELayer or
(MoELayer, index) items; index defaults to the layer's layer_index. Keys: the held adapter's own (stacked ones
too, with its adapter_config.json), else the checkpoint's module names, else experts_module
("model.layers.{layer}.mlp.experts.{expert}") + "." + projection_names (gate, up, down). dtype: 'as_held'
(default), 'float32' or 'bfloat16'. Returns {'layers', 'tensors', 'bytes'}. tilemoe.torch.MoELoRA's
save_pretrained writes a module's parameters.)doc");
}

}  // namespace tilemoe::binding
