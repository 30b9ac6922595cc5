#pragma once
// Zeroing with streaming stores (SSE2: every x86-64), for blocks that a call writes once and does
// not read again: the LoRA gradients that no product writes when a backward overwrites them (every
// expert without tokens: 38 MB at DeepSeek-V2-Lite's size, r = 16, in a 1-token backward). A plain
// store reads each line from memory before writing it; a streaming store does not.
#include <emmintrin.h>

#include <cstddef>
#include <cstdint>

namespace tilemoe::kernels {

// p[0, bytes) = 0. Streaming stores are weakly ordered: call streaming_stores_done() before
// another thread may read p.
inline void zero_bytes_streaming(void* dst, std::size_t bytes) {
  auto* p = static_cast<unsigned char*>(dst);
  for (; bytes > 0 && (reinterpret_cast<std::uintptr_t>(p) & 15) != 0; --bytes) *p++ = 0;
  const __m128i zero = _mm_setzero_si128();
  for (; bytes >= 16; bytes -= 16, p += 16) _mm_stream_si128(reinterpret_cast<__m128i*>(p), zero);
  for (; bytes > 0; --bytes) *p++ = 0;
}

// p[0, n) = 0.0f (all bits zero), as zero_bytes_streaming.
inline void zero_floats_streaming(float* p, std::size_t n) { zero_bytes_streaming(p, n * sizeof(float)); }

inline void streaming_stores_done() { _mm_sfence(); }

}  // namespace tilemoe::kernels
