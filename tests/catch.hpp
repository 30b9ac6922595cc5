#pragma once
// Catch2 v2 (Debian 12) and v3 (the device machine's system copy) behind one include.
#if defined(TILEMOE_CATCH_V3)
#include <catch2/catch_all.hpp>
#else
#include <catch2/catch.hpp>
#endif
