// tilemoe::fail, for every layer (its own library, tilemoe_error, that each layer links): one
// definition compiled for baseline x86-64 (include/tilemoe/error.hpp says why it is not inline).
#include "tilemoe/error.hpp"

namespace tilemoe {

void fail(ErrorKind kind, const std::string& message) { throw Error(kind, message); }

}  // namespace tilemoe
