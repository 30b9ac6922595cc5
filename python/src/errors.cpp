#include "errors.hpp"

#include "tilemoe/error.hpp"

namespace tilemoe::binding {
namespace {

// Owned by the module for the life of the process: exception classes are never unloaded.
PyObject* g_invalid_argument = nullptr;
PyObject* g_bad_file = nullptr;
PyObject* g_unsupported = nullptr;
PyObject* g_state = nullptr;

PyObject* new_error_class(py::module_& m, const char* name, const char* doc, PyObject* base, PyObject* builtin) {
  std::string qualified = std::string("tilemoe.") + name;
  // Both arms as py::tuple: pybind11 3 gives make_tuple typed results that differ by arity.
  py::tuple bases = builtin ? py::tuple(py::make_tuple(py::handle(base), py::handle(builtin))) : py::tuple(py::make_tuple(py::handle(base)));
  PyObject* cls = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, bases.ptr(), nullptr);
  if (!cls) throw py::error_already_set();
  m.add_object(name, py::handle(cls));  // takes its own reference; ours lives as long as the process
  return cls;
}

}  // namespace

void register_errors(py::module_& m) {
  PyObject* base = new_error_class(m, "Error", "Every error the tilemoe runtime reports.", PyExc_Exception, nullptr);
  g_invalid_argument = new_error_class(m, "InvalidArgumentError", "A shape, id or option given by the caller is wrong.", base,
                                       PyExc_ValueError);
  g_bad_file = new_error_class(m, "BadFileError", "A file is missing, truncated or its header lies.", base, PyExc_OSError);
  g_unsupported = new_error_class(m, "UnsupportedError", "A valid request this build or CPU cannot serve.", base,
                                  PyExc_NotImplementedError);
  g_state = new_error_class(m, "StateError", "A call at the wrong time, such as backward with no saved forward.", base,
                            PyExc_RuntimeError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      PyObject* cls = g_state;
      switch (e.kind()) {
        case ErrorKind::invalid_argument: cls = g_invalid_argument; break;
        case ErrorKind::bad_file: cls = g_bad_file; break;
        case ErrorKind::unsupported: cls = g_unsupported; break;
        case ErrorKind::state: cls = g_state; break;
      }
      PyErr_SetString(cls, e.what());
    }
  });
}

void type_error(const std::string& message) { throw py::type_error(message); }
void value_error(const std::string& message) {
  PyErr_SetString(g_invalid_argument, message.c_str());
  throw py::error_already_set();
}
void unsupported_error(const std::string& message) {
  PyErr_SetString(g_unsupported, message.c_str());
  throw py::error_already_set();
}

}  // namespace tilemoe::binding
