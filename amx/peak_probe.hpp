#pragma once
// Measures what one core's matrix unit can do, so the bench reports time against this
// machine's own limit rather than a datasheet's.
#include <cstdint>

namespace tilemoe::kernels {

// Runs `iterations` rounds of independent bf16 dot products on this thread and returns the
// FLOPs done (2 per multiply-add). Only where the ISA is available.
double peak_flops_amx(std::int64_t iterations);
double peak_flops_avx512(std::int64_t iterations);
// f32 multiplies and adds apart, as the avx2 kernels do them.
double peak_flops_avx2(std::int64_t iterations);

}  // namespace tilemoe::kernels
