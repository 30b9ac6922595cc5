#pragma once
// The activation kernels' SwiGLU parameters from a layer's shape.
#include "amx/activation.hpp"
#include "tilemoe/config.hpp"

namespace tilemoe {

inline kernels::SwigluForm swiglu_form(const MoeShape& s) { return {s.swiglu_limit, s.swiglu_alpha, s.swiglu_up_offset}; }

}  // namespace tilemoe
