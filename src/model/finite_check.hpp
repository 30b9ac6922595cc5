#pragma once
// Weights with NaN or Inf are rejected at load: they would silently poison every token routed
// to that expert. (NaN in activations is different: it propagates, as in PyTorch.)
#include <cmath>
#include <cstddef>
#include <string>

#include "tilemoe/bf16.hpp"
#include "tilemoe/error.hpp"

namespace tilemoe {

inline void require_finite(const bf16* v, std::size_t n, const std::string& what) {
  for (std::size_t i = 0; i < n; ++i)
    if (!bf16_is_finite(v[i]))
      fail(ErrorKind::bad_file, what + ": element " + std::to_string(i) + " is " + (v[i] & 0x7fu ? "NaN" : "Inf") +
                                    "; weights must be finite");
}

inline void require_finite(const float* v, std::size_t n, const std::string& what) {
  for (std::size_t i = 0; i < n; ++i)
    if (!std::isfinite(v[i]))
      fail(ErrorKind::bad_file, what + ": element " + std::to_string(i) + " is " + (std::isnan(v[i]) ? "NaN" : "Inf") +
                                    "; weights must be finite");
}

}  // namespace tilemoe
