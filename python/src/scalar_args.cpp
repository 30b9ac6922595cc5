#include "scalar_args.hpp"

#include <climits>

#include "errors.hpp"

namespace tilemoe::binding {
namespace {

std::string type_name(py::handle v) { return py::str(py::type::handle_of(v).attr("__name__")).cast<std::string>(); }

}  // namespace

int int_arg(py::handle v, const char* name) {
  // numpy integers and other __index__ types count; bool and float do not.
  if (py::isinstance<py::bool_>(v) || !PyIndex_Check(v.ptr()))
    type_error(std::string(name) + ": expected an int, got " + type_name(v));
  py::int_ i = py::reinterpret_steal<py::int_>(PyNumber_Index(v.ptr()));
  if (!i) throw py::error_already_set();
  int overflow = 0;
  long long x = PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);
  if (overflow || x < INT_MIN || x > INT_MAX) value_error(std::string(name) + ": " + py::str(v).cast<std::string>() + " is out of range");
  return static_cast<int>(x);
}

std::optional<int> optional_int_arg(py::handle v, const char* name) {
  if (v.is_none()) return std::nullopt;
  return int_arg(v, name);
}

double float_arg(py::handle v, const char* name) {
  if (py::isinstance<py::bool_>(v) || !(py::isinstance<py::float_>(v) || PyIndex_Check(v.ptr())))
    type_error(std::string(name) + ": expected a float, got " + type_name(v));
  return py::float_(py::reinterpret_borrow<py::object>(v)).cast<double>();
}

bool bool_arg(py::handle v, const char* name) {
  if (py::isinstance<py::bool_>(v)) return v.cast<bool>();
  if (type_name(v) == "bool_") return py::bool_(py::reinterpret_borrow<py::object>(v)).cast<bool>();  // numpy.bool_
  type_error(std::string(name) + ": expected a bool, got " + type_name(v));
}

std::string str_arg(py::handle v, const char* name) {
  if (py::isinstance<py::str>(v)) return v.cast<std::string>();
  if (py::hasattr(v, "__fspath__")) {
    py::object p = v.attr("__fspath__")();
    if (py::isinstance<py::str>(p)) return p.cast<std::string>();
  }
  type_error(std::string(name) + ": expected a str or path, got " + type_name(v));
}

std::optional<std::string> optional_str_arg(py::handle v, const char* name) {
  if (v.is_none()) return std::nullopt;
  return str_arg(v, name);
}

}  // namespace tilemoe::binding
