#pragma once
// The pieces of the extension module tilemoe._tilemoe, each registered by its own file.
#include <pybind11/pybind11.h>

namespace tilemoe::binding {

namespace py = pybind11;

void bind_runtime(py::module_& m);  // Runtime, Task
void bind_layer(py::module_& m);    // MoELayer
void bind_optim(py::module_& m);    // _adamw_step
void bind_save(py::module_& m);     // save_peft_adapter

}  // namespace tilemoe::binding
