#include "lora_args.hpp"

#include <string>

#include "errors.hpp"
#include "tensor_arg.hpp"

namespace tilemoe::binding {
namespace {

constexpr const char* kFactorNames[6] = {"gate_a", "gate_b", "up_a", "up_b", "down_a", "down_b"};

MoeShape shape_of(const MoeLayerConfig& c) { return {c.hidden, c.intermediate, c.num_experts, c.top_k}; }

// A [E, r, in] and B [E, out, r] of projection p, r taken from A.
int check_factor_pair(const MoeLayerConfig& cfg, Projection p, const TensorArg& a, const TensorArg& b) {
  const MoeShape s = shape_of(cfg);
  a.require_shape({cfg.num_experts, -1, projection_in(s, p)});
  const std::int64_t r = a.dim(1);
  if (r < 1 || r > cfg.lora_rank)
    value_error(std::string(a.name) + ": rank " + std::to_string(r) + " (shape[1]) must be in [1, lora_rank = " +
                std::to_string(cfg.lora_rank) + "] of the layer's config");
  b.require_shape({cfg.num_experts, projection_out(s, p), r});
  return static_cast<int>(r);
}

}  // namespace

LoraRanks ranks_of(const LayerLoraView& view) { return {view.proj[0].rank, view.proj[1].rank, view.proj[2].rank}; }

LoraSetArg lora_set_arg(const MoeLayerConfig& cfg, const std::array<py::object, 6>& factors, py::handle scales,
                        py::handle present) {
  LoraSetArg out;
  py::list keep;
  const MoeShape s = shape_of(cfg);
  const int E = cfg.num_experts;

  const float* scale_rows = nullptr;
  bool uniform_given = false;
  float uniform = 0;
  if (!scales.is_none()) {
    if (py::isinstance<py::float_>(scales) || py::isinstance<py::int_>(scales)) {
      uniform = scales.cast<float>();
      uniform_given = true;
    } else {
      if (!py::hasattr(scales, "shape"))
        type_error("scales: expected None, a float, or a float32 array [3, num_experts], got " +
                   py::str(py::type::handle_of(scales).attr("__name__")).cast<std::string>());
      TensorArg t = tensor_arg(scales, "scales", Access::read, {DType::f32});
      t.require_shape({3, E});
      scale_rows = static_cast<const float*>(t.data);
      keep.append(scales);
    }
  }
  const std::uint8_t* present_rows = nullptr;
  TensorArg pres;
  if (optional_tensor_arg(present, "present", Access::read, {DType::u8}, pres)) {
    pres.require_shape({3, E});
    present_rows = static_cast<const std::uint8_t*>(pres.data);
    keep.append(present);
  }

  for (int i = 0; i < 3; ++i) {
    const Projection p = kProjections[static_cast<std::size_t>(i)];
    py::handle a_obj = factors[2 * i], b_obj = factors[2 * i + 1];
    if (a_obj.is_none() && b_obj.is_none()) continue;
    if (a_obj.is_none() || b_obj.is_none())
      value_error(std::string(kFactorNames[a_obj.is_none() ? 2 * i : 2 * i + 1]) + ": missing (None) while " +
                  kFactorNames[a_obj.is_none() ? 2 * i + 1 : 2 * i] + " is given; pass both or neither");
    if (cfg.lora_rank == 0)
      value_error(std::string(kFactorNames[2 * i]) + ": the layer was built with lora_rank 0 and takes no LoRA; set "
                  "MoEConfig.lora_rank (or lora_rank= of from_checkpoint)");
    // f32 or bf16 (numpy: uint16 bits), read in place either way; A and B of a projection alike.
    TensorArg a = tensor_arg(a_obj, kFactorNames[2 * i], Access::read, {DType::f32, DType::bf16});
    TensorArg b = tensor_arg(b_obj, kFactorNames[2 * i + 1], Access::read, {DType::f32, DType::bf16});
    if (a.dtype != b.dtype)
      type_error(std::string(kFactorNames[2 * i]) + " is " + dtype_name(a.dtype, a.is_torch) + " but " + kFactorNames[2 * i + 1] + " is " +
                 dtype_name(b.dtype, b.is_torch) + "; A and B of one projection must share a dtype (float32 or bfloat16)");
    auto& v = out.view[p];
    v.rank = check_factor_pair(cfg, p, a, b);
    v.in = projection_in(s, p);
    v.out = projection_out(s, p);
    v.a = a.data;
    v.b = b.data;
    v.dtype = a.dtype == DType::bf16 ? LoraDType::bf16 : LoraDType::f32;
    v.uniform_scale = uniform_given ? uniform : static_cast<float>(lora_scaling(cfg.lora_alpha, v.rank, cfg.use_rslora));
    if (scale_rows) v.scale = scale_rows + static_cast<std::size_t>(i) * E;
    if (present_rows) v.present = present_rows + static_cast<std::size_t>(i) * E;
    keep.append(a_obj);
    keep.append(b_obj);
  }
  out.keepalive = std::move(keep);
  return out;
}

LayerLoraGrad lora_grads_arg(const MoeLayerConfig& cfg, const LoraRanks& ranks, py::handle grads, py::list& keep) {
  LayerLoraGrad out{};
  if (grads.is_none()) return out;
  // A projection's dtype is set by whichever of its gradients is given; all agree (checked below).
  std::array<py::object, 6> given;
  if (py::isinstance<py::dict>(grads)) {
    py::dict d = py::reinterpret_borrow<py::dict>(grads);
    for (auto item : d) {
      std::string key = py::str(item.first).cast<std::string>();
      int found = -1;
      for (int i = 0; i < 6; ++i)
        if (key == kFactorNames[i]) found = i;
      if (found < 0) value_error("grads: unknown key '" + key + "'; the keys are gate_a, gate_b, up_a, up_b, down_a, down_b");
      given[static_cast<std::size_t>(found)] = py::reinterpret_borrow<py::object>(item.second);
    }
  } else if (py::isinstance<py::sequence>(grads) && !py::isinstance<py::str>(grads)) {
    py::sequence seq = py::reinterpret_borrow<py::sequence>(grads);
    if (seq.size() != 6)
      value_error("grads: a sequence of " + std::to_string(seq.size()) +
                  "; expected 6 (gate_a, gate_b, up_a, up_b, down_a, down_b), or a dict");
    for (std::size_t i = 0; i < 6; ++i) given[i] = seq[i];
  } else {
    type_error("grads: expected None, a dict or a sequence of six arrays, got " +
               py::str(py::type::handle_of(grads).attr("__name__")).cast<std::string>());
  }

  const MoeShape s = shape_of(cfg);
  const std::int64_t E = cfg.num_experts;
  int first = -1;  // the first gradient given: the others take its dtype
  DType dtype = DType::f32;
  for (int i = 0; i < 6; ++i) {
    py::handle obj = given[static_cast<std::size_t>(i)];
    if (!obj || obj.is_none()) continue;
    const Projection p = kProjections[static_cast<std::size_t>(i / 2)];
    const int r = ranks[static_cast<std::size_t>(i / 2)];
    if (r == 0)
      value_error(std::string("grads['") + kFactorNames[i] + "']: the saved forward has no LoRA on " + projection_name(p) +
                  ", so there is no such gradient");
    // f32 or bf16 (numpy: uint16 bits), one dtype for all: backward writes each in its own.
    TensorArg t = tensor_arg(obj, kFactorNames[i], Access::write, {DType::f32, DType::bf16});
    if (first < 0) {
      first = i;
      dtype = t.dtype;
    } else if (t.dtype != dtype) {
      type_error(std::string("grads['") + kFactorNames[i] + "'] is " + dtype_name(t.dtype, t.is_torch) + " but grads['" +
                 kFactorNames[first] + "'] is " + dtype_name(dtype, t.is_torch) +
                 "; the gradients of one backward share a dtype (float32 or bfloat16)");
    }
    if (i % 2 == 0) t.require_shape({E, r, projection_in(s, p)});
    else t.require_shape({E, projection_out(s, p), r});
    LoraProjectionGrad& g = out[static_cast<std::size_t>(i / 2)];
    g.dtype = t.dtype == DType::bf16 ? LoraDType::bf16 : LoraDType::f32;
    if (i % 2 == 0) g.a = t.data;
    else g.b = t.data;
    keep.append(obj);
  }
  return out;
}

}  // namespace tilemoe::binding
