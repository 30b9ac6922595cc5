#pragma once
// The arrays a caller hands the binding: numpy arrays or torch CPU tensors, used in place (zero
// copy). Each check names the argument, so a wrong type, dtype, layout or shape raises TypeError
// or ValueError before the runtime sees a pointer. numpy has no bfloat16: numpy callers pass bf16
// as uint16 arrays of the raw bits.
#include <pybind11/pybind11.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace tilemoe::binding {

namespace py = pybind11;

enum class DType { bf16, f32, i64, u8 };

// Read: the runtime only reads it. Write: the runtime writes it, so it must be writeable and, for
// torch, not tracked by autograd.
enum class Access { read, write };

struct TensorArg {
  const char* name = "";  // the argument's name, for messages
  void* data = nullptr;
  DType dtype = DType::f32;
  std::vector<std::int64_t> shape;
  bool is_torch = false;

  std::int64_t dim(std::size_t i) const { return shape[i]; }
  std::string shape_string() const;
  // ValueError unless the shape is exactly `want` (-1: any extent).
  void require_shape(std::initializer_list<std::int64_t> want) const;
};

using DTypes = std::initializer_list<DType>;

// Throws TypeError for anything but a numpy array or torch tensor of one of the `allowed` dtypes,
// ValueError for one that is not on the CPU, not C-contiguous, or (numpy) misaligned or
// byte-swapped.
TensorArg tensor_arg(py::handle obj, const char* name, Access access, DTypes allowed);
// None stays absent; anything else as tensor_arg.
bool optional_tensor_arg(py::handle obj, const char* name, Access access, DTypes allowed, TensorArg& out);

// A new uninitialised C-contiguous array: a torch tensor or a numpy array.
py::object new_array(bool torch, DType dtype, const std::vector<std::int64_t>& shape);

const char* dtype_name(DType dtype, bool torch);

}  // namespace tilemoe::binding
