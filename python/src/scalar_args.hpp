#pragma once
// Scalar arguments taken as plain Python objects, so that a wrong type raises a TypeError naming
// the argument rather than pybind11's list of signatures.
#include <pybind11/pybind11.h>

#include <optional>
#include <string>

namespace tilemoe::binding {

namespace py = pybind11;

int int_arg(py::handle v, const char* name);
std::optional<int> optional_int_arg(py::handle v, const char* name);  // None: absent
double float_arg(py::handle v, const char* name);
bool bool_arg(py::handle v, const char* name);
std::string str_arg(py::handle v, const char* name);                   // str or os.PathLike
std::optional<std::string> optional_str_arg(py::handle v, const char* name);

}  // namespace tilemoe::binding
