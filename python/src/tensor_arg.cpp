#include "tensor_arg.hpp"

#include <pybind11/numpy.h>

#include "errors.hpp"

namespace tilemoe::binding {
namespace {

// torch is optional: its types are looked up once it has been imported by someone, and kept for
// the life of the process (the 1-token call path must not pay for attribute lookups by name).
struct TorchTypes {
  py::object tensor_type, strided, bf16, f32, i64, u8, boolean, empty;
  // Attribute names made once: getattr by C string builds a new str each time.
  py::object dtype_name, layout_name, is_cpu_name, is_contiguous_name, requires_grad_name, shape_name, data_ptr_name;
  bool loaded = false;
};

TorchTypes& torch_types() {
  static TorchTypes* t = new TorchTypes();  // never destroyed: Python may be gone at exit
  if (!t->loaded) {
    py::dict modules = py::module_::import("sys").attr("modules");
    if (!modules.contains("torch")) return *t;
    py::object torch = modules["torch"];
    t->tensor_type = torch.attr("Tensor");
    t->strided = torch.attr("strided");
    t->bf16 = torch.attr("bfloat16");
    t->f32 = torch.attr("float32");
    t->i64 = torch.attr("int64");
    t->u8 = torch.attr("uint8");
    t->boolean = torch.attr("bool");
    t->empty = torch.attr("empty");
    t->dtype_name = py::str("dtype");
    t->layout_name = py::str("layout");
    t->is_cpu_name = py::str("is_cpu");
    t->is_contiguous_name = py::str("is_contiguous");
    t->requires_grad_name = py::str("requires_grad");
    t->shape_name = py::str("shape");
    t->data_ptr_name = py::str("data_ptr");
    t->loaded = true;
  }
  return *t;
}

bool numpy_loaded() {
  static bool loaded = false;
  if (!loaded) loaded = py::module_::import("sys").attr("modules").cast<py::dict>().contains("numpy");
  return loaded;
}

std::string type_name(py::handle obj) { return py::str(py::type::handle_of(obj).attr("__name__")).cast<std::string>(); }

[[noreturn]] void wrong_dtype(const char* name, const std::string& got, bool torch, DTypes allowed) {
  std::string list;
  for (DType d : allowed) list += (list.empty() ? "" : " or ") + std::string(dtype_name(d, torch));
  type_error(std::string(name) + ": dtype " + got + ", expected " + list);
}

bool is_allowed(DType d, DTypes allowed) {
  for (DType a : allowed)
    if (a == d) return true;
  return false;
}

TensorArg from_torch(py::handle t, const char* name, Access access, DTypes allowed, const TorchTypes& tt) {
  TensorArg a;
  a.name = name;
  a.is_torch = true;
  py::object dtype = t.attr(tt.dtype_name);
  bool known = true;
  if (dtype.is(tt.bf16)) a.dtype = DType::bf16;
  else if (dtype.is(tt.f32)) a.dtype = DType::f32;
  else if (dtype.is(tt.i64)) a.dtype = DType::i64;
  else if (dtype.is(tt.u8) || dtype.is(tt.boolean)) a.dtype = DType::u8;
  else known = false;
  if (!known || !is_allowed(a.dtype, allowed)) wrong_dtype(name, py::str(dtype).cast<std::string>(), true, allowed);
  if (!py::object(t.attr(tt.layout_name)).is(tt.strided))
    value_error(std::string(name) + ": a sparse tensor; pass a dense (strided) one");
  if (t.attr(tt.is_cpu_name).ptr() != Py_True)
    value_error(std::string(name) + ": a tensor on " + py::str(t.attr("device")).cast<std::string>() +
                "; the runtime reads CPU memory: pass tensor.cpu()");
  if (t.attr(tt.is_contiguous_name)().ptr() != Py_True) value_error(std::string(name) + ": not contiguous; pass tensor.contiguous()");
  if (access == Access::write && t.attr(tt.requires_grad_name).ptr() == Py_True)
    value_error(std::string(name) + ": requires grad, but the runtime writes it in place; pass a tensor that does not "
                "(or its .detach())");
  py::tuple shape = py::reinterpret_borrow<py::tuple>(t.attr(tt.shape_name));  // torch.Size is a tuple
  a.shape.resize(shape.size());
  for (std::size_t i = 0; i < a.shape.size(); ++i) a.shape[i] = PyLong_AsLongLong(shape[i].ptr());
  a.data = PyLong_AsVoidPtr(t.attr(tt.data_ptr_name)().ptr());
  return a;
}

TensorArg from_numpy(const py::array& arr, const char* name, Access access, DTypes allowed) {
  TensorArg a;
  a.name = name;
  py::dtype dt = arr.dtype();
  const char kind = dt.kind();
  const auto size = dt.itemsize();
  bool known = true;
  if (kind == 'u' && size == 2) a.dtype = DType::bf16;  // bfloat16 bits
  else if (kind == 'f' && size == 4) a.dtype = DType::f32;
  else if (kind == 'i' && size == 8) a.dtype = DType::i64;
  else if ((kind == 'u' && size == 1) || kind == 'b') a.dtype = DType::u8;
  else known = false;
  if (!known || !is_allowed(a.dtype, allowed)) wrong_dtype(name, py::str(py::handle(dt)).cast<std::string>(), false, allowed);
  if (size > 1 && dt.byteorder() == '>') value_error(std::string(name) + ": big-endian array; pass one in native byte order");
  const int flags = py::detail::array_proxy(arr.ptr())->flags;
  if (!(flags & py::detail::npy_api::NPY_ARRAY_C_CONTIGUOUS_))
    value_error(std::string(name) + ": not C-contiguous; pass numpy.ascontiguousarray(...)");
  if (!(flags & py::detail::npy_api::NPY_ARRAY_ALIGNED_)) value_error(std::string(name) + ": misaligned array");
  if (access == Access::write && !(flags & py::detail::npy_api::NPY_ARRAY_WRITEABLE_))
    value_error(std::string(name) + ": read-only array, but the runtime writes it");
  a.shape.assign(arr.shape(), arr.shape() + arr.ndim());
  a.data = const_cast<void*>(arr.data());
  return a;
}

}  // namespace

const char* dtype_name(DType dtype, bool torch) {
  switch (dtype) {
    case DType::bf16: return torch ? "torch.bfloat16" : "uint16 (bfloat16 bits)";
    case DType::f32: return torch ? "torch.float32" : "float32";
    case DType::i64: return torch ? "torch.int64" : "int64";
    case DType::u8: return torch ? "torch.uint8 or torch.bool" : "uint8 or bool";
  }
  return "?";
}

std::string TensorArg::shape_string() const {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

void TensorArg::require_shape(std::initializer_list<std::int64_t> want) const {
  bool ok = want.size() == shape.size();
  std::size_t i = 0;
  for (std::int64_t d : want) {
    if (ok && d >= 0 && shape[i] != d) ok = false;
    ++i;
  }
  if (ok) return;
  std::string w = "[";
  i = 0;
  for (std::int64_t d : want) w += (i++ ? ", " : "") + (d >= 0 ? std::to_string(d) : std::string("*"));
  value_error(std::string(name) + ": shape " + shape_string() + ", expected " + w + "]");
}

TensorArg tensor_arg(py::handle obj, const char* name, Access access, DTypes allowed) {
  const TorchTypes& tt = torch_types();
  if (tt.loaded && py::isinstance(obj, tt.tensor_type)) return from_torch(obj, name, access, allowed, tt);
  if (numpy_loaded() && py::isinstance<py::array>(obj))
    return from_numpy(py::reinterpret_borrow<py::array>(obj), name, access, allowed);
  type_error(std::string(name) + ": expected a numpy array or a torch tensor, got " + type_name(obj));
}

bool optional_tensor_arg(py::handle obj, const char* name, Access access, DTypes allowed, TensorArg& out) {
  if (obj.is_none()) return false;
  out = tensor_arg(obj, name, access, allowed);
  return true;
}

py::object new_array(bool torch, DType dtype, const std::vector<std::int64_t>& shape) {
  py::tuple dims(shape.size());
  for (std::size_t i = 0; i < shape.size(); ++i) dims[i] = py::int_(shape[i]);
  if (torch) {
    const TorchTypes& tt = torch_types();
    py::object dt = dtype == DType::bf16 ? tt.bf16 : dtype == DType::f32 ? tt.f32 : dtype == DType::i64 ? tt.i64 : tt.u8;
    return tt.empty(dims, py::arg("dtype") = dt);
  }
  const char* np_dtype = dtype == DType::bf16 ? "uint16" : dtype == DType::f32 ? "float32" : dtype == DType::i64 ? "int64" : "uint8";
  return py::module_::import("numpy").attr("empty")(dims, py::arg("dtype") = np_dtype);
}

}  // namespace tilemoe::binding
