#pragma once
// Zeroing with streaming stores (SSE2: every x86-64), for blocks that a call writes once and does
// not read again: the LoRA gradients that no product writes when a backward overwrites them (every
// expert without tokens: 38 MB at DeepSeek-V2-Lite's size, r = 16, in a 1-token backward). A plain
// store reads each line from memory before writing it; a streaming store does not.
#include <emmintrin.h>

#include <cstddef>
#include <cstdint>

namespace tilemoe::kernels {

// p[0, n) = 0. Streaming stores are weakly ordered: call streaming_stores_done() before another
// thread may read p.
inline void zero_floats_streaming(float* p, std::size_t n) {
  for (; n > 0 && (reinterpret_cast<std::uintptr_t>(p) & 15) != 0; --n) *p++ = 0.0f;
  const __m128i zero = _mm_setzero_si128();
  for (; n >= 4; n -= 4, p += 4) _mm_stream_si128(reinterpret_cast<__m128i*>(p), zero);
  for (; n > 0; --n) *p++ = 0.0f;
}

inline void streaming_stores_done() { _mm_sfence(); }

}  // namespace tilemoe::kernels
