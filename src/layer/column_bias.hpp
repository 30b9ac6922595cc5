#pragma once
// The experts' biases (gpt-oss) on a block of a product's f32 result.
#include <cstddef>

namespace tilemoe {

// c[i][j] += bias[j] for m rows of n columns (row stride ldc). A few adds a column beside the
// product's 2 x hidden per row: left to the compiler's vectorizer.
inline void add_column_bias(float* c, std::size_t ldc, int m, int n, const float* bias) {
  for (int i = 0; i < m; ++i) {
    float* row = c + static_cast<std::size_t>(i) * ldc;
    for (int j = 0; j < n; ++j) row[j] += bias[j];
  }
}

}  // namespace tilemoe
