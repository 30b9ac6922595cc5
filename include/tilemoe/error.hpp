#pragma once
// Errors that cross the public API. Every message names where the problem is (file, tensor key,
// layer, expert, projection) so that a user can act on it without a debugger.
#include <stdexcept>
#include <string>

namespace tilemoe {

enum class ErrorKind {
  invalid_argument,  // shapes, ids, options given by the caller
  bad_file,          // a file that is missing, truncated or whose header lies
  unsupported,       // a valid request this build or CPU cannot serve (e.g. AMX without AMX)
  state,             // a call at the wrong time (e.g. popping an empty cache stack)
};

// Visible from libtilemoe.so so that a caller's catch (const tilemoe::Error&) matches what it throws.
class __attribute__((visibility("default"))) Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
  ErrorKind kind() const noexcept { return kind_; }

 private:
  ErrorKind kind_;
};

// Defined in one baseline-compiled file (src/error.cpp), not inline: an inline copy compiled into an
// AVX-512 kernel file (with a vzeroupper before the throw) could be the one the linker keeps for
// every caller (tests/build/test_isa_objects.sh).
[[noreturn]] __attribute__((visibility("default"))) void fail(ErrorKind kind, const std::string& message);

}  // namespace tilemoe
