#pragma once
// Element types as safetensors names them. Only the types a MoE checkpoint, a PEFT adapter or a
// reference file holds are here; a file with any other dtype is refused at open.
#include <cstddef>
#include <optional>
#include <string_view>

namespace tilemoe::io {

enum class Dtype { BF16, F16, F32, F8_E4M3, I8, U8, I32, I64 };

std::size_t dtype_size(Dtype);
const char* dtype_name(Dtype);                       // "BF16", "F8_E4M3", ...
std::optional<Dtype> parse_dtype(std::string_view);  // exact, case-sensitive safetensors names

}  // namespace tilemoe::io
