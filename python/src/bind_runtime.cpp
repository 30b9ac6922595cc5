#include "bindings.hpp"
#include "py_layer.hpp"
#include "py_runtime.hpp"
#include "scalar_args.hpp"

namespace tilemoe::binding {

void bind_runtime(py::module_& m) {
  py::class_<PyRuntime, std::shared_ptr<PyRuntime>>(m, "Runtime", R"doc(
Worker threads pinned per core, the ISA's kernels and one ordered task queue. Layers made with the
same isa and threads share one (tilemoe.Runtime.shared); pass runtime= to a layer to choose.

Runtime(isa="auto", threads=None): isa "auto" (AMX > AVX512-BF16 > AVX2 > portable; TILEMOE_ISA
overrides), "amx", "avx512", "avx2" or "portable"; threads None or 0: one per core.)doc")
      .def(py::init([](py::object isa, py::object threads) {
             return std::make_shared<PyRuntime>(str_arg(isa, "isa"), optional_int_arg(threads, "threads").value_or(0));
           }),
           py::arg("isa") = "auto", py::arg("threads") = py::none())
      .def_static(
          "shared",
          [](py::object isa, py::object threads) {
            return PyRuntime::shared(str_arg(isa, "isa"), optional_int_arg(threads, "threads").value_or(0));
          },
          py::arg("isa") = "auto", py::arg("threads") = py::none(),
          "The runtime every layer made with this isa and thread count uses by default.")
      .def_property_readonly("isa", [](PyRuntime& r) { return std::string(r.runtime().isa()); },
                             "The kernels in use: 'amx', 'avx512', 'avx2' or 'portable'.")
      .def_property_readonly("threads", [](PyRuntime& r) { return r.runtime().threads(); })
      .def("sync", &PyRuntime::sync,
           "Waits for every task submitted before; raises the first failure among them not yet reported.")
      .def("__repr__", [](PyRuntime& r) {
        return "tilemoe.Runtime(isa='" + std::string(r.runtime().isa()) + "', threads=" + std::to_string(r.runtime().threads()) + ")";
      });

  py::class_<Task>(m, "Task", "A queued call. wait() returns its result (output, grad_input or None) or raises its error.")
      .def("wait", &Task::wait)
      .def_property_readonly("ticket", [](const Task& t) { return t.ticket; })
      .def("__repr__", [](const Task& t) { return "tilemoe.Task(ticket=" + std::to_string(t.ticket) + ")"; });
}

}  // namespace tilemoe::binding
