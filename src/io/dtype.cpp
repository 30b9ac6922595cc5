#include "dtype.hpp"

#include <array>

namespace tilemoe::io {
namespace {

struct DtypeEntry {
  Dtype dtype;
  const char* name;
  std::size_t size;
};

constexpr std::array<DtypeEntry, 8> kDtypes{{
    {Dtype::BF16, "BF16", 2},
    {Dtype::F16, "F16", 2},
    {Dtype::F32, "F32", 4},
    {Dtype::F8_E4M3, "F8_E4M3", 1},
    {Dtype::I8, "I8", 1},
    {Dtype::U8, "U8", 1},
    {Dtype::I32, "I32", 4},
    {Dtype::I64, "I64", 8},
}};

const DtypeEntry& entry(Dtype d) {
  for (const auto& e : kDtypes)
    if (e.dtype == d) return e;
  // An out-of-range enum value can only come from a cast; answer with something harmless.
  static constexpr DtypeEntry kInvalid{Dtype::U8, "?", 1};
  return kInvalid;
}

}  // namespace

std::size_t dtype_size(Dtype d) { return entry(d).size; }
const char* dtype_name(Dtype d) { return entry(d).name; }

std::optional<Dtype> parse_dtype(std::string_view name) {
  for (const auto& e : kDtypes)
    if (name == e.name) return e.dtype;
  return std::nullopt;
}

}  // namespace tilemoe::io
