#pragma once
// The errors the ISA kernels raise, built and thrown in baseline-compiled code (kernel_errors.cpp):
// a message built inside an AVX-512 or AMX file instantiates std::string's and std::to_string's
// inline code there, and the linker may keep that copy for every caller in the program
// (tests/build/test_isa_objects.sh found GCC 13's to_string so built in gemm_mxfp4_amx.cpp).

namespace tilemoe::kernels {

// Error(unsupported): "<kernel>: <why the tiles cannot be used here>".
[[noreturn]] void fail_tiles_unusable(const char* kernel);
// Error(invalid_argument): "<kernel>: <what>".
[[noreturn]] void fail_kernel_argument(const char* kernel, const char* what);
// Error(invalid_argument): "<kernel>: <value> <what>".
[[noreturn]] void fail_kernel_argument(const char* kernel, long long value, const char* what);

}  // namespace tilemoe::kernels
