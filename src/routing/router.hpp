#pragma once
// A checkpoint's own router: which k experts each token goes to and with what weights, computed
// as Hugging Face transformers computes it for the model type, so that random hidden states are
// routed the way the model routes real ones. The per-model choices (softmax or sigmoid, groups,
// correction bias, renormalisation, scaling) arrive through ModelConfig; read_model_config sets
// them per model type.
#include <cstdint>
#include <vector>

#include "src/model/checkpoint.hpp"
#include "src/model/model_config.hpp"
#include "tilemoe/bf16.hpp"

namespace tilemoe {

namespace numa {
class ThreadPool;
}

struct Routing {
  int tokens = 0;
  int top_k = 0;
  std::vector<std::int64_t> expert_ids;  // [T][k]: highest choosing score first, ties to the lower id
  std::vector<float> weights;            // [T][k]: the weight of each chosen expert
};

// Throws tilemoe::Error naming the layer: bad_file when the router weight or correction bias
// does not have the config's shape, invalid_argument for routing settings that cannot work
// (an unknown scoring_func or topk_method, n_group not dividing the experts, topk_group groups
// holding fewer than top_k experts, ...).
void check_router(const ModelConfig& config, const RouterWeights& router, int layer);

// `hidden` is bf16 [tokens][hidden size]. Logits are f32 dot products of the hidden state (made
// f32) and the f32 router weight; the result does not depend on `pool`, which only spreads the
// tokens over threads. A token whose logits are not finite is an invalid_argument error.
Routing route_tokens(const ModelConfig& config, const RouterWeights& router, int layer, const bf16* hidden, int tokens,
                     numa::ThreadPool* pool = nullptr);

}  // namespace tilemoe
