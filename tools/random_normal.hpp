#pragma once
// Standard normal values for `forward|backward --tokens`: hidden states and upstream gradients
// of a typical scale, the same for a seed on every platform (std::normal_distribution is not).
#include <cstddef>
#include <cstdint>
#include <vector>

#include "tilemoe/bf16.hpp"

namespace tilemoe::cli {

// `count` draws of N(0, 1), rounded to bf16; `stream` separates the sequences of one seed.
std::vector<bf16> random_normal_bf16(std::size_t count, std::uint64_t seed, std::uint64_t stream);

}  // namespace tilemoe::cli
