#pragma once
// The bench's outside baseline (issue: "a oneDNN matmul baseline, one primitive per expert and
// projection, weights prepacked by oneDNN"): the same MoE layer forward, without LoRA, written as a
// user of oneDNN would write it. Tokens are grouped by expert; for each expert with tokens, in
// turn: gate is a matmul with a swish post-op, up a matmul whose post-op multiplies by that and
// writes h in bf16, down a third matmul; its rows go to their routing slots, and the slots are
// combined with their routing weights as tilemoe does. The matmuls use oneDNN's own threads and its own weight layout (format_tag::any,
// reordered once here). A primitive is made per projection and row count the first time that
// count is met (creation is not timed: the bench runs every routing once before timing), and
// serves every expert. Where oneDNN has no bf16 matmul (CPUs before AVX512-BF16), the products run in
// f32 on the same bf16 values: what oneDNN offers a user there, and data_type() says so.
#include <cstdint>
#include <memory>
#include <string>

#include "numa/thread_pool.hpp"
#include "src/model/expert_weights.hpp"

namespace tilemoe::cli {

class OnednnMoeBaseline {
 public:
  explicit OnednnMoeBaseline(const ExpertWeightsView& w);
  ~OnednnMoeBaseline();
  OnednnMoeBaseline(OnednnMoeBaseline&&) noexcept;

  // x: bf16 [tokens][hidden]; ids, weights: [tokens][top_k] (ids < 0 skipped); out: f32 [tokens][hidden].
  // `pool` runs the row gather, the scatter and the weighted combine around the matmuls.
  void forward(int tokens, int top_k, const bf16* x, const std::int64_t* ids, const float* weights, float* out, numa::ThreadPool& pool);
  // oneDNN's name for the matmul implementation it picked, e.g. "brg:avx512_core_amx".
  std::string implementation() const;
  // "bf16", or "f32" where this CPU has no bf16 matmul in oneDNN.
  std::string data_type() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tilemoe::cli
