#pragma once
// <immintrin.h> without GCC 12's false warnings: its AVX-512 headers self-initialise their
// "undefined" vectors and then warn about them (GCC PR105593, fixed in 13).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
