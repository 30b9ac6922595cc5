#pragma once
// Each token's int8 codes of x for integer weights, quantized once a forward by the first gather
// unit that needs them; the token's other routed rows copy them. Each routed row had quantized its
// own copy: a token routed to k experts was quantized k times (at 4096 tokens of DeepSeek-V2-Lite,
// top-6, 24,576 rows of 2048 values instead of 4,096). A row's codes depend only on the row, so
// who quantizes a token changes no bit.
//
// Waiting is only ever for a token that a running caller has claimed and is quantizing, which
// waits for nothing, so no order of the gather units can deadlock.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "amx/aligned_vector.hpp"

namespace tilemoe {

class TokenCodes {
 public:
  // Before the gather, on one thread: no token quantized yet, room for `tokens` rows of `ld` codes.
  void prepare(int tokens, std::size_t ld);

  // Token t's codes (ld bytes) and its scale. Exactly one caller a call runs
  // `quantize(codes, &scale)` for t; the others wait for it. If that throws, the token is marked
  // failed, the exception goes on to its caller, and every later or waiting caller for t throws
  // an Error of kind state.
  template <typename Quantize>
  const std::int8_t* get(int t, Quantize&& quantize, float& scale) {
    std::int8_t* codes = codes_.data() + static_cast<std::size_t>(t) * ld_;
    float* s = &scales_[static_cast<std::size_t>(t)];
    if (claim(t)) {
      try {
        quantize(codes, s);
      } catch (...) {
        publish(t, kFailed);
        throw;
      }
      publish(t, kReady);
    } else {
      wait(t);
    }
    scale = *s;
    return codes;
  }

  std::size_t ld() const { return ld_; }

 private:
  static constexpr int kFresh = 0, kClaimed = 1, kReady = 2, kFailed = 3;
  bool claim(int t);
  void publish(int t, int state);
  void wait(int t) const;  // until ready; throws if failed
  std::size_t ld_ = 0;
  AlignedVector<std::int8_t> codes_;  // grown, never shrunk
  std::vector<float> scales_;
  std::vector<int> state_;  // per token (atomic_ref)
};

}  // namespace tilemoe
