#include "amx/kernel_errors.hpp"

#include <string>

#include "amx/isa.hpp"
#include "tilemoe/error.hpp"

namespace tilemoe::kernels {

void fail_tiles_unusable(const char* kernel) {
  fail(ErrorKind::unsupported, std::string(kernel) + ": " + isa_unavailable_reason(Isa::amx_bf16));
}

void fail_kernel_argument(const char* kernel, const char* what) { fail(ErrorKind::invalid_argument, std::string(kernel) + ": " + what); }

void fail_kernel_argument(const char* kernel, long long value, const char* what) {
  fail(ErrorKind::invalid_argument, std::string(kernel) + ": " + std::to_string(value) + " " + what);
}

}  // namespace tilemoe::kernels
