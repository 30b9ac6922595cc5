#pragma once
// Python exceptions for tilemoe::Error's kinds, and the argument errors the binding raises itself.
// A runtime error keeps the runtime's message, which names the argument, file, layer or expert.
#include <pybind11/pybind11.h>

#include <string>

namespace tilemoe::binding {

namespace py = pybind11;

// tilemoe.Error and its kinds: InvalidArgumentError (a ValueError), BadFileError (an OSError),
// UnsupportedError (a NotImplementedError), StateError (a RuntimeError); registered on `m` with a
// translator for tilemoe::Error.
void register_errors(py::module_& m);

// Raised by the binding's own checks, before anything reaches the runtime: TypeError, and
// InvalidArgumentError (a ValueError) as the runtime raises for its own checks.
[[noreturn]] void type_error(const std::string& message);
[[noreturn]] void value_error(const std::string& message);
[[noreturn]] void unsupported_error(const std::string& message);

}  // namespace tilemoe::binding
