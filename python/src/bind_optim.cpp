// tilemoe._adamw_step: the fused AdamW of tilemoe.optim.MoEAdamW over a module's flat LoRA
// arrays. Each group is one factor's arrays for every expert, [E, ...] float32, with the step
// number each expert's update takes (0: that expert is not updated, as PyTorch skips a parameter
// whose .grad is None); consecutive experts of one step number become one segment.
#include <tilemoe/adamw.hpp>

#include <string>
#include <vector>

#include "bindings.hpp"
#include "errors.hpp"
#include "py_runtime.hpp"
#include "scalar_args.hpp"
#include "tensor_arg.hpp"

namespace tilemoe::binding {
namespace {

void adamw_step_py(PyRuntime& rt, py::handle lr, py::handle beta1, py::handle beta2, py::handle eps, py::handle weight_decay,
                   py::list groups) {
  AdamWOptions o;
  o.lr = float_arg(lr, "lr");
  o.beta1 = float_arg(beta1, "beta1");
  o.beta2 = float_arg(beta2, "beta2");
  o.eps = float_arg(eps, "eps");
  o.weight_decay = float_arg(weight_decay, "weight_decay");
  std::vector<AdamWSegment> segments;
  for (std::size_t gi = 0; gi < groups.size(); ++gi) {
    py::tuple g = groups[gi].cast<py::tuple>();
    if (g.size() != 5) value_error("groups[" + std::to_string(gi) + "]: expected (param, grad, exp_avg, exp_avg_sq, steps)");
    const TensorArg p = tensor_arg(g[0], "param", Access::write, {DType::f32});
    const TensorArg grad = tensor_arg(g[1], "grad", Access::read, {DType::f32});
    const TensorArg m = tensor_arg(g[2], "exp_avg", Access::write, {DType::f32});
    const TensorArg v = tensor_arg(g[3], "exp_avg_sq", Access::write, {DType::f32});
    const TensorArg steps = tensor_arg(g[4], "steps", Access::read, {DType::i64});
    if (p.shape.empty()) value_error("param: needs a leading expert dimension");
    for (const TensorArg* t : {&grad, &m, &v})
      if (t->shape != p.shape) value_error(std::string(t->name) + ": shape " + t->shape_string() + ", expected param's " + p.shape_string());
    const std::int64_t experts = p.dim(0);
    steps.require_shape({experts});
    std::size_t per_expert = 1;
    for (std::size_t d = 1; d < p.shape.size(); ++d) per_expert *= static_cast<std::size_t>(p.dim(d));
    const auto* step = static_cast<const std::int64_t*>(steps.data);
    for (std::int64_t e = 0; e < experts;) {
      std::int64_t end = e + 1;
      while (end < experts && step[end] == step[e]) ++end;
      if (step[e] != 0) {
        const std::size_t off = static_cast<std::size_t>(e) * per_expert;
        segments.push_back({static_cast<float*>(p.data) + off, static_cast<const float*>(grad.data) + off, static_cast<float*>(m.data) + off,
                            static_cast<float*>(v.data) + off, static_cast<std::size_t>(end - e) * per_expert, step[e]});
      }
      e = end;
    }
  }
  const PyRuntime::Ticket before = rt.last_ticket();
  {
    py::gil_scoped_release release;
    adamw_step(rt.runtime(), o, segments.data(), segments.size());
  }
  rt.finished_through(before);
}

}  // namespace

void bind_optim(py::module_& m) {
  m.def("_adamw_step", &adamw_step_py, py::arg("runtime"), py::arg("lr"), py::arg("beta1"), py::arg("beta2"), py::arg("eps"),
        py::arg("weight_decay"), py::arg("groups"),
        "AdamW over flat [E, ...] float32 arrays in place (tilemoe.optim.MoEAdamW's step): groups of (param, grad, exp_avg, "
        "exp_avg_sq, steps), steps int64 [E] each expert's step number for this update, 0 to leave it alone.");
}

}  // namespace tilemoe::binding
