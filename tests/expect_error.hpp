#pragma once
// A check that fn throws a tilemoe::Error of the given kind whose message mentions a text; the
// message is shown when the check fails.
#include <string>

#include "catch.hpp"
#include "tilemoe/error.hpp"

namespace tilemoe::test {

template <typename Fn>
void expect_error(Fn&& fn, ErrorKind kind, const std::string& must_mention) {
  try {
    fn();
    FAIL("expected an error mentioning '" << must_mention << "'");
  } catch (const Error& e) {
    INFO(e.what());
    CHECK(e.kind() == kind);
    CHECK(std::string(e.what()).find(must_mention) != std::string::npos);
  }
}

}  // namespace tilemoe::test
