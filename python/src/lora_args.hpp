#pragma once
// The LoRA arguments of update_lora_weights and backward: the caller's f32 or bf16 arrays, checked
// against the layer's shape and turned into the runtime's zero-copy views (tilemoe/lora.hpp).
#include <pybind11/pybind11.h>

#include <array>

#include "tilemoe/lora.hpp"
#include "tilemoe/moe_layer.hpp"

namespace tilemoe::binding {

namespace py = pybind11;

// The ranks of a LoRA set per projection (gate, up, down); 0: no LoRA there. Backward writes
// gradients of the saved forward's set, so the grad arrays are checked against these.
using LoraRanks = std::array<int, 3>;
LoraRanks ranks_of(const LayerLoraView& view);

struct LoraSetArg {
  LayerLoraView view;
  py::object keepalive;  // the arrays the view points into
};

// A: [E, r, in], B: [E, out, r] f32 or bf16 (A and B alike) per projection (both None: no LoRA
// there). scales: None (alpha / r of the config, or alpha / sqrt(r) with rsLoRA), a float for
// every expert, or f32 [3, E]; present: None (every expert) or uint8/bool [3, E].
LoraSetArg lora_set_arg(const MoeLayerConfig& cfg, const std::array<py::object, 6>& factors, py::handle scales,
                        py::handle present);

// grads: None, a dict with keys gate_a, gate_b, up_a, up_b, down_a, down_b (missing or None: not
// wanted) or a sequence of those six; shaped like the set of `ranks`, f32 or bf16, all of one
// dtype. Arrays kept in `keep`.
LayerLoraGrad lora_grads_arg(const MoeLayerConfig& cfg, const LoraRanks& ranks, py::handle grads, py::list& keep);
// The one dtype of gradients from lora_grads_arg (f32 when none is given).
inline LoraDType lora_grads_dtype(const LayerLoraGrad& g) {
  for (const auto& p : g)
    if (p.a || p.b) return p.dtype;
  return LoraDType::f32;
}

}  // namespace tilemoe::binding
