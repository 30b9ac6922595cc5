#include "bindings.hpp"
#include "errors.hpp"
#include "layer_config.hpp"
#include "py_layer.hpp"
#include "scalar_args.hpp"

namespace tilemoe::binding {
namespace {

std::shared_ptr<PyRuntime> runtime_arg(py::handle runtime, py::handle isa, int threads) {
  if (runtime.is_none()) return PyRuntime::shared(str_arg(isa, "isa"), threads);
  if (!py::isinstance<PyRuntime>(runtime)) type_error("runtime: expected a tilemoe.Runtime or None");
  return runtime.cast<std::shared_ptr<PyRuntime>>();
}

LoraFactors factors_of(py::object ga, py::object gb, py::object ua, py::object ub, py::object da, py::object db) {
  return {std::move(ga), std::move(gb), std::move(ua), std::move(ub), std::move(da), std::move(db)};
}

// "as_stored" (or None), "float32" or "bfloat16": AdapterStorage.
AdapterStorage adapter_storage_arg(py::object v, const char* name) {
  if (v.is_none()) return AdapterStorage::as_stored;
  const std::string s = str_arg(v, name);
  if (s == "as_stored") return AdapterStorage::as_stored;
  if (s == "float32") return AdapterStorage::f32;
  if (s == "bfloat16") return AdapterStorage::bf16;
  value_error(std::string(name) + ": '" + s + "'; expected 'as_stored', 'float32' or 'bfloat16'");
}

std::unique_ptr<PyLayer> from_checkpoint(py::object model_dir, py::object layer, py::object adapter, py::object isa,
                                         py::object threads, py::object numa_nodes, py::object max_tokens,
                                         py::object max_cache_depth, py::object lora_rank, py::object lora_alpha,
                                         py::object use_rslora, py::object runtime, py::object weights, py::object group_size,
                                         py::object quantized, py::object backward_weight_copy, py::object adapter_storage) {
  CheckpointLayerOptions o;
  const std::string dir = str_arg(model_dir, "model_dir");
  const int index = int_arg(layer, "layer");
  o.adapter = optional_str_arg(adapter, "adapter").value_or("");
  o.max_tokens = int_arg(max_tokens, "max_tokens");
  o.max_cache_depth = int_arg(max_cache_depth, "max_cache_depth");
  o.lora_rank = int_arg(lora_rank, "lora_rank");
  o.lora_alpha = lora_alpha.is_none() ? o.lora_rank : float_arg(lora_alpha, "lora_alpha");
  o.use_rslora = bool_arg(use_rslora, "use_rslora");
  o.numa_nodes = optional_int_arg(numa_nodes, "numa_nodes").value_or(1);
  if (!weights.is_none()) {
    const std::string w = str_arg(weights, "weights");
    if (w == "bf16") o.weight_type = WeightType::bf16;
    else if (w == "int8") o.weight_type = WeightType::int8;
    else if (w == "int4") o.weight_type = WeightType::int4;
    else if (w == "mxfp4") o.weight_type = WeightType::mxfp4;
    else value_error("weights: '" + w + "'; expected 'bf16', 'int8', 'int4' or 'mxfp4'");
  }
  o.group_size = int_arg(group_size, "group_size");
  o.quantized_dir = optional_str_arg(quantized, "quantized").value_or("");
  o.backward_weight_copy = bool_arg(backward_weight_copy, "backward_weight_copy");
  o.adapter_storage = adapter_storage_arg(adapter_storage, "adapter_storage");
  auto rt = runtime_arg(runtime, isa, optional_int_arg(threads, "threads").value_or(0));
  return std::make_unique<PyLayer>(std::move(rt), dir, index, o);
}

template <class T>
py::object optional_value(const std::optional<T>& v) {
  return v ? py::cast(*v) : py::none();
}

}  // namespace

void bind_layer(py::module_& m) {
  py::class_<PyLayer>(m, "MoELayer", R"doc(
One MoE layer's routed experts on this CPU, for inference and LoRA fine-tuning.

MoELayer(config, gate, up, down, *, isa="auto", runtime=None, layer_index=None): a
tilemoe.MoEConfig and the bf16 expert weights in Hugging Face orientation, gate and up
[E, intermediate, hidden], down [E, hidden, intermediate] (torch.bfloat16 tensors, or numpy uint16
arrays of bf16 bits), packed once here. With up=None, gate holds gate and up stacked,
[E, 2 * intermediate, hidden], gate's rows first (vLLM's w13, transformers v5's gate_up_proj). gate_bias,
up_bias [E, intermediate] and down_bias [E, hidden] (bf16, keyword only, copied here): the experts'
biases, as gpt-oss has (with MoEConfig's swiglu_alpha and swiglu_up_offset). layer_index: the layer's index in the model, for PEFT
names and adapters.

Arrays are numpy arrays or torch CPU tensors, C-contiguous, used in place: x bf16 [T, hidden],
expert_ids int64 [T, k] (ids < 0 are skipped), weights f32 [T, k], out bf16 or f32 [T, hidden].
LoRA A f32 [E, r, in] and B f32 [E, out, r] are read in place at every call (an optimizer step on
them is seen by the next call). The GIL is released while the runtime works.)doc")
      .def(py::init([](py::object config, py::object gate, py::object up, py::object down, py::object isa, py::object runtime,
                       py::object layer_index, py::object gate_bias, py::object up_bias, py::object down_bias) {
             const LayerSetup setup = layer_setup_from_py(config);
             auto rt = runtime_arg(runtime, isa, setup.threads);
             return std::make_unique<PyLayer>(std::move(rt), config, gate, up, down, optional_int_arg(layer_index, "layer_index"),
                                              std::array<py::object, 3>{gate_bias, up_bias, down_bias});
           }),
           py::arg("config"), py::arg("gate"), py::arg("up"), py::arg("down"), py::kw_only(), py::arg("isa") = "auto",
           py::arg("runtime") = py::none(), py::arg("layer_index") = py::none(), py::arg("gate_bias") = py::none(),
           py::arg("up_bias") = py::none(), py::arg("down_bias") = py::none())
      .def_static("from_checkpoint", &from_checkpoint, py::arg("model_dir"), py::arg("layer"), py::arg("adapter") = py::none(),
                  py::arg("isa") = "auto", py::arg("threads") = py::none(), py::arg("numa_nodes") = py::none(), py::kw_only(),
                  py::arg("max_tokens") = 2048, py::arg("max_cache_depth") = 1, py::arg("lora_rank") = 0,
                  py::arg("lora_alpha") = py::none(), py::arg("use_rslora") = false, py::arg("runtime") = py::none(),
                  py::arg("weights") = py::none(), py::arg("group_size") = 128, py::arg("quantized") = py::none(),
                  py::arg("backward_weight_copy") = false, py::arg("adapter_storage") = py::none(),
                  R"doc(
Layer `layer` of a Hugging Face checkpoint directory (single or sharded safetensors), with a PEFT
adapter directory or `tilemoe convert-lora` file if given. max_tokens: the largest batch;
max_cache_depth: forwards saved for backward at once (0: inference only); lora_rank, lora_alpha
(default: lora_rank), use_rslora: for LoRA sets given later with update_lora_weights. weights:
"int8" or "int4" quantizes the experts at load (group_size: int4 inputs per scale); quantized: a
directory written by `tilemoe quantize` from this checkpoint, loaded as it is (its type is used).
backward_weight_copy: as in MoEConfig (bf16 weights). adapter_storage: as in load_adapter.)doc")

      .def("forward", [](PyLayer& l, py::object x, py::object ids, py::object w, py::object out) { return l.forward(x, ids, w, out); },
           py::arg("x"), py::arg("expert_ids"), py::arg("weights"), py::arg("out") = py::none(),
           "out[t] = sum_j weights[t,j] * expert_{ids[t,j]}(x[t]); returns out (allocated as bf16 like x when None).")
      .def(
          "forward_sft",
          [](PyLayer& l, py::object x, py::object ids, py::object w, py::object out, py::object save) {
            return l.forward_sft(x, ids, w, out, bool_arg(save, "save_for_backward"));
          },
          py::arg("x"), py::arg("expert_ids"), py::arg("weights"), py::arg("out") = py::none(), py::arg("save_for_backward") = true,
          "forward that, with save_for_backward, saves what backward needs (max_cache_depth at once).")
      .def(
          "backward",
          [](PyLayer& l, py::object go, py::object gi, py::object grads, py::object accumulate) {
            return l.backward(go, gi, grads, bool_arg(accumulate, "accumulate"));
          },
          py::arg("grad_output"), py::arg("grad_input") = py::none(), py::arg("grads") = py::none(), py::arg("accumulate") = false,
          R"doc(
Pops the newest saved forward. For loss = sum(out * grad_output) writes grad_input (bf16 or f32
like grad_output; returned) and, where grads names arrays (dict with keys gate_a, gate_b, up_a,
up_b, down_a, down_b, or a sequence of six, None: not wanted), the LoRA gradients of the set that
forward used: overwritten (zero for experts without tokens) or added to with accumulate.)doc")
      .def(
          "update_lora_weights",
          [](PyLayer& l, py::object ga, py::object gb, py::object ua, py::object ub, py::object da, py::object db, py::object scales,
             py::object present) { l.update_lora_weights(factors_of(ga, gb, ua, ub, da, db), scales, present); },
          py::arg("gate_a") = py::none(), py::arg("gate_b") = py::none(), py::arg("up_a") = py::none(), py::arg("up_b") = py::none(),
          py::arg("down_a") = py::none(), py::arg("down_b") = py::none(), py::kw_only(), py::arg("scales") = py::none(),
          py::arg("present") = py::none(), R"doc(
Points the layer at another LoRA set, zero copy: A f32 [E, r, in], B f32 [E, out, r] per
projection (both None: no LoRA there; r <= the config's lora_rank). scales: None (lora_alpha / r,
or / sqrt(r) with rsLoRA), one float, or f32 [3, E] per projection and expert; present: None
(every expert) or bool/uint8 [3, E]. The arrays must stay unresized while the layer uses them.)doc")

      .def("submit_forward", [](PyLayer& l, py::object x, py::object ids, py::object w, py::object out) {
             return l.submit_forward(x, ids, w, out);
           },
           py::arg("x"), py::arg("expert_ids"), py::arg("weights"), py::arg("out") = py::none(), "forward as a task: returns a Task at once.")
      .def(
          "submit_forward_sft",
          [](PyLayer& l, py::object x, py::object ids, py::object w, py::object out, py::object save) {
            return l.submit_forward_sft(x, ids, w, out, bool_arg(save, "save_for_backward"));
          },
          py::arg("x"), py::arg("expert_ids"), py::arg("weights"), py::arg("out") = py::none(), py::arg("save_for_backward") = true,
          "forward_sft as a task.")
      .def(
          "submit_backward",
          [](PyLayer& l, py::object go, py::object gi, py::object grads, py::object accumulate) {
            return l.submit_backward(go, gi, grads, bool_arg(accumulate, "accumulate"));
          },
          py::arg("grad_output"), py::arg("grad_input") = py::none(), py::arg("grads") = py::none(), py::arg("accumulate") = false,
          "backward as a task.")
      .def(
          "submit_update_lora_weights",
          [](PyLayer& l, py::object ga, py::object gb, py::object ua, py::object ub, py::object da, py::object db, py::object scales,
             py::object present) { return l.submit_update_lora_weights(factors_of(ga, gb, ua, ub, da, db), scales, present); },
          py::arg("gate_a") = py::none(), py::arg("gate_b") = py::none(), py::arg("up_a") = py::none(), py::arg("up_b") = py::none(),
          py::arg("down_a") = py::none(), py::arg("down_b") = py::none(), py::kw_only(), py::arg("scales") = py::none(),
          py::arg("present") = py::none(), "update_lora_weights as a task: tasks queued before it still read the old set.")
      .def("sync", &PyLayer::sync,
           "Waits for every task submitted to the layer's runtime; raises the first failure not yet reported.")

      .def(
          "load_adapter",
          [](PyLayer& l, py::object path, py::object layer, py::object storage) {
            l.load_adapter(str_arg(path, "path"), optional_int_arg(layer, "layer"), adapter_storage_arg(storage, "storage"));
          },
          py::arg("path"), py::arg("layer") = py::none(), py::arg("storage") = py::none(),
          "A PEFT adapter directory or convert-lora file, held by the layer; needs no saved forward. layer: its index "
          "in the model (default: the layer's layer_index). storage: "
          "'as_stored' (default: bfloat16 when every factor tensor of the file is BF16, else float32), 'float32' "
          "or 'bfloat16' (other values rounded to nearest even: half the memory and the bytes read at decode).")
      .def("unload_adapter", &PyLayer::unload_adapter, "Back to no LoRA; needs no saved forward.")
      .def("lora_weights", &PyLayer::lora_weights,
           "Copies of the LoRA in use: {projection: {'a', 'b', 'scale', 'present'}} for gate, up, down (numpy).")
      .def("adapter_stacked_keys", &PyLayer::adapter_stacked_keys,
           "Where the layer's adapter keeps each projection's LoRA when PEFT stacked it over the experts "
           "(target_parameters): {projection: {'key_a', 'key_b', 'first_row', 'b_rows', 'row_step'}}, the stacked projections only. "
           "A [r*E, in] holds expert e's rows at e*r; B [b_rows, r*E] its column j at j*E + e, this projection's rows "
           "first_row, first_row + row_step, ... (gpt-oss interleaves gate's and up's: row_step 2); gate and up of "
           "gate_up_proj share both keys (one A). Empty while update_lora_weights' arrays "
           "are in use.")

      .def_property_readonly("config", [](const PyLayer& l) { return config_to_py(l.config(), l.runtime()->runtime().threads()); })
      .def_property_readonly("lora_scale", &PyLayer::lora_scale, "lora_alpha / lora_rank (or / sqrt with rsLoRA) of the config.")
      .def_property_readonly("lora_ranks", [](const PyLayer& l) {
        LoraRanks r = l.lora_ranks();
        return py::make_tuple(r[0], r[1], r[2]);
      }, "The ranks of the LoRA set in use, gate, up, down (0: none).")
      .def_property_readonly("saved_forwards", &PyLayer::saved_forwards, "Forwards saved for backward (submitted ones included).")
      .def_property_readonly("cache_bytes", &PyLayer::cache_bytes)
      .def_property_readonly("weight_bytes", &PyLayer::weight_bytes)
      .def_property_readonly("runtime", &PyLayer::runtime)
      .def_property_readonly("isa", [](const PyLayer& l) { return std::string(l.runtime()->runtime().isa()); })
      .def_property_readonly("model_dir", [](const PyLayer& l) { return optional_value(l.origin().model_dir); })
      .def_property_readonly("adapter", [](const PyLayer& l) { return optional_value(l.origin().adapter); })
      .def_property_readonly("layer_index", [](const PyLayer& l) { return optional_value(l.origin().layer_index); })
      .def(
          "_time_forward",
          [](PyLayer& l, py::object x, py::object ids, py::object w, py::object out, py::object iterations) {
            return l.time_forward(x, ids, w, out, int_arg(iterations, "iterations"));
          },
          py::arg("x"), py::arg("expert_ids"), py::arg("weights"), py::arg("out"), py::arg("iterations"),
          "For tilemoe.bench: seconds per MoeLayer::forward call in a C++ loop, to compare with the Python call.")
      .def("__repr__", [](const PyLayer& l) {
        const MoeLayerConfig& c = l.config();
        return "tilemoe.MoELayer(experts=" + std::to_string(c.num_experts) + ", top_k=" + std::to_string(c.top_k) +
               ", hidden=" + std::to_string(c.hidden) + ", intermediate=" + std::to_string(c.intermediate) +
               ", isa='" + l.runtime()->runtime().isa() + "')";
      });
}

}  // namespace tilemoe::binding
