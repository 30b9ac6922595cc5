#include "src/routing/router.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>

#include "numa/thread_pool.hpp"
#include "tilemoe/error.hpp"

namespace tilemoe {
namespace {

enum class Scoring { softmax, sigmoid, sqrt_softplus };
enum class Selection { greedy, group_limited_greedy, noaux_tc };

// The config decoded and checked once per call, so the per-token loop only computes.
struct RouterPlan {
  int experts = 0, hidden = 0, top_k = 0;
  Scoring scoring = Scoring::softmax;
  Selection selection = Selection::greedy;
  int n_group = 1, topk_group = 1, group_size = 0;
  bool normalize = false;
  float scale = 1.0f;
  float unchosen_group_value = 0.0f;
  const float* weight = nullptr;  // [E][H]
  const float* bias = nullptr;    // [E]; only noaux_tc chooses with it
  const float* logit_bias = nullptr;  // [E]; added to the logits (gpt-oss)
};

std::string where(int layer) { return "layer " + std::to_string(layer) + " router: "; }

RouterPlan plan_router(const ModelConfig& c, const RouterWeights& r, int layer) {
  RouterPlan p;
  p.experts = c.shape.num_experts;
  p.hidden = c.shape.hidden;
  p.top_k = c.shape.top_k;
  const std::string at = where(layer);
  if (!c.routing_unsupported.empty())
    fail(ErrorKind::unsupported, at + "model_type '" + c.model_type + "': " + c.routing_unsupported +
                                     "; give the experts ids and weights instead (forward --input, or the API)");
  if (c.is_hash_routed(layer))
    fail(ErrorKind::unsupported, at + "model_type '" + c.model_type + "': layer " + std::to_string(layer) +
                                     " chooses its experts by token id (hash routing through tid2eid), not from the hidden states; "
                                     "give the experts ids and weights instead (forward --input, or the API)");
  if (p.experts < 1 || p.hidden < 1 || p.top_k < 1 || p.top_k > p.experts)
    fail(ErrorKind::invalid_argument, at + "needs 1 <= top_k <= experts and a positive hidden size (top_k " + std::to_string(p.top_k) +
                                          ", " + std::to_string(p.experts) + " experts, hidden " + std::to_string(p.hidden) + ")");
  const std::size_t want = static_cast<std::size_t>(p.experts) * p.hidden;
  if (r.weight.size() != want)
    fail(ErrorKind::bad_file, at + "weight has " + std::to_string(r.weight.size()) + " values, expected [" + std::to_string(p.experts) +
                                  ", " + std::to_string(p.hidden) + "] (experts x hidden size of config.json)");
  if (!r.correction_bias.empty() && r.correction_bias.size() != static_cast<std::size_t>(p.experts))
    fail(ErrorKind::bad_file, at + "e_score_correction_bias has " + std::to_string(r.correction_bias.size()) + " values, expected " +
                                  std::to_string(p.experts) + " (one per expert)");
  for (std::size_t i = 0; i < want; ++i)
    if (!std::isfinite(r.weight[i]))
      fail(ErrorKind::bad_file, at + "weight of expert " + std::to_string(i / p.hidden) + " is not finite at column " +
                                    std::to_string(i % p.hidden));
  for (std::size_t e = 0; e < r.correction_bias.size(); ++e)
    if (!std::isfinite(r.correction_bias[e]))
      fail(ErrorKind::bad_file, at + "e_score_correction_bias of expert " + std::to_string(e) + " is not finite");
  if (!r.logit_bias.empty() && r.logit_bias.size() != static_cast<std::size_t>(p.experts))
    fail(ErrorKind::bad_file, at + "bias has " + std::to_string(r.logit_bias.size()) + " values, expected " + std::to_string(p.experts) +
                                  " (one per expert)");
  for (std::size_t e = 0; e < r.logit_bias.size(); ++e)
    if (!std::isfinite(r.logit_bias[e])) fail(ErrorKind::bad_file, at + "bias of expert " + std::to_string(e) + " is not finite");

  if (c.scoring_func == "softmax") p.scoring = Scoring::softmax;
  else if (c.scoring_func == "sigmoid") p.scoring = Scoring::sigmoid;
  else if (c.scoring_func == "sqrtsoftplus") p.scoring = Scoring::sqrt_softplus;
  else fail(ErrorKind::invalid_argument, at + "scoring_func '" + c.scoring_func + "' is not one tilemoe knows (softmax, sigmoid, sqrtsoftplus)");
  if (c.topk_method == "greedy") p.selection = Selection::greedy;
  else if (c.topk_method == "group_limited_greedy") p.selection = Selection::group_limited_greedy;
  else if (c.topk_method == "noaux_tc") p.selection = Selection::noaux_tc;
  else
    fail(ErrorKind::invalid_argument,
         at + "topk_method '" + c.topk_method + "' is not one tilemoe knows (greedy, group_limited_greedy, noaux_tc)");

  if (p.selection != Selection::greedy) {
    p.n_group = c.n_group;
    p.topk_group = c.topk_group;
    if (p.n_group < 1 || p.experts % p.n_group != 0)
      fail(ErrorKind::invalid_argument, at + "n_group " + std::to_string(p.n_group) + " does not divide the " +
                                            std::to_string(p.experts) + " experts (" + c.topk_method + ")");
    p.group_size = p.experts / p.n_group;
    if (p.topk_group < 1 || p.topk_group > p.n_group)
      fail(ErrorKind::invalid_argument, at + "topk_group " + std::to_string(p.topk_group) + " is not in [1, n_group " +
                                            std::to_string(p.n_group) + "]");
    if (static_cast<long long>(p.topk_group) * p.group_size < p.top_k)
      fail(ErrorKind::invalid_argument, at + "topk_group " + std::to_string(p.topk_group) + " groups of " + std::to_string(p.group_size) +
                                            " experts hold fewer than top_k " + std::to_string(p.top_k) + " experts");
    if (p.selection == Selection::noaux_tc && p.group_size < 2)
      fail(ErrorKind::invalid_argument, at + "noaux_tc scores a group by its best two experts, but n_group " + std::to_string(p.n_group) +
                                            " leaves " + std::to_string(p.group_size) + " expert per group");
  }
  if (!std::isfinite(c.routed_scaling_factor))
    fail(ErrorKind::invalid_argument, at + "routed_scaling_factor is not finite");
  p.normalize = c.norm_topk_prob;
  p.unchosen_group_value = c.unchosen_groups_neg_inf ? -std::numeric_limits<float>::infinity() : 0.0f;
  p.scale = static_cast<float>(c.routed_scaling_factor);  // PyTorch multiplies an f32 tensor by the f32 of a Python float
  p.weight = r.weight.data();
  if (p.selection == Selection::noaux_tc && !r.correction_bias.empty()) p.bias = r.correction_bias.data();
  if (!r.logit_bias.empty()) p.logit_bias = r.logit_bias.data();
  return p;
}

// Accumulated in double, then rounded: the f32 logit as close to exact as it gets, so which of
// two nearly tied experts wins depends on the values and not on a summation order.
float dot(const float* x, const float* w, int n) {
  double acc[8] = {};
  int i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += static_cast<double>(x[i + j]) * w[i + j];
  for (; i < n; ++i) acc[0] += static_cast<double>(x[i]) * w[i];
  return static_cast<float>(((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])));
}

// torch.topk made deterministic: the `count` largest values, largest first, ties to the lower index.
void top_indices(const float* values, int n, int count, int* out) {
  std::vector<int> idx(static_cast<std::size_t>(n));
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + count, idx.end(),
                    [&](int a, int b) { return values[a] > values[b] || (values[a] == values[b] && a < b); });
  std::copy(idx.begin(), idx.begin() + count, out);
}

void route_one(const RouterPlan& p, int layer, int token, const bf16* x_bf16, std::int64_t* ids, float* weights) {
  const int E = p.experts, H = p.hidden, k = p.top_k;
  std::vector<float> x(static_cast<std::size_t>(H)), logits(static_cast<std::size_t>(E)), scores(logits.size());
  for (int h = 0; h < H; ++h) x[h] = bf16_to_float(x_bf16[h]);
  for (int e = 0; e < E; ++e) {
    logits[e] = dot(x.data(), p.weight + static_cast<std::size_t>(e) * H, H);
    if (p.logit_bias) logits[e] += p.logit_bias[e];
    if (!std::isfinite(logits[e]))
      fail(ErrorKind::invalid_argument, where(layer) + "token " + std::to_string(token) + "'s logit for expert " + std::to_string(e) +
                                            " is not finite (is the hidden state finite?)");
  }
  if (p.scoring == Scoring::softmax) {
    const double m = *std::max_element(logits.begin(), logits.end());
    std::vector<double> ex(logits.size());
    double sum = 0;
    for (int e = 0; e < E; ++e) sum += ex[e] = std::exp(logits[e] - m);
    for (int e = 0; e < E; ++e) scores[e] = static_cast<float>(ex[e] / sum);
  } else if (p.scoring == Scoring::sigmoid) {
    for (int e = 0; e < E; ++e) scores[e] = static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(logits[e]))));
  } else {
    // sqrt(softplus(l)), softplus as torch's (beta 1, threshold 20: l itself above 20).
    for (int e = 0; e < E; ++e) {
      const double l = logits[e];
      scores[e] = static_cast<float>(std::sqrt(l > 20.0 ? l : std::log1p(std::exp(l))));
    }
  }

  // What the experts are chosen by: the score, plus DeepSeek-V3's correction bias, which
  // balances the load without entering the weights.
  std::vector<float> choice = scores;
  if (p.bias)
    for (int e = 0; e < E; ++e) choice[e] = scores[e] + p.bias[e];

  if (p.selection != Selection::greedy) {
    const int G = p.n_group, S = p.group_size;
    std::vector<float> group_score(static_cast<std::size_t>(G));
    for (int g = 0; g < G; ++g) {
      const float* v = choice.data() + static_cast<std::size_t>(g) * S;
      if (p.selection == Selection::group_limited_greedy) {
        group_score[g] = *std::max_element(v, v + S);
      } else {
        int best2[2];
        top_indices(v, S, 2, best2);
        group_score[g] = v[best2[0]] + v[best2[1]];
      }
    }
    std::vector<int> groups(static_cast<std::size_t>(p.topk_group));
    top_indices(group_score.data(), G, p.topk_group, groups.data());
    std::vector<char> keep(static_cast<std::size_t>(G), 0);
    for (int g : groups) keep[g] = 1;
    // Experts outside the chosen groups get 0.0, not -inf, as DeepSeek-V3's masked_fill does: with
    // a negative correction bias such an expert can still beat a chosen group's (Kimi-Linear: -inf).
    for (int e = 0; e < E; ++e)
      if (!keep[e / S]) choice[e] = p.unchosen_group_value;
  }

  std::vector<int> chosen(static_cast<std::size_t>(k));
  top_indices(choice.data(), E, k, chosen.data());
  for (int j = 0; j < k; ++j) {
    ids[j] = chosen[j];
    // noaux_tc weighs with the unbiased score; the softmax methods return topk's values, which
    // are the (masked) scores themselves.
    weights[j] = p.selection == Selection::noaux_tc ? scores[chosen[j]] : choice[chosen[j]];
  }
  if (p.normalize) {
    float sum = 0;
    for (int j = 0; j < k; ++j) sum += weights[j];
    // DeepSeek-V3 adds 1e-20; for a softmax's top-k sum (>= 1/E) it changes nothing in f32, so
    // Mixtral's and Qwen's plain division is the same formula.
    sum += 1e-20f;
    for (int j = 0; j < k; ++j) weights[j] /= sum;
  }
  for (int j = 0; j < k; ++j) weights[j] *= p.scale;
}

}  // namespace

void check_router(const ModelConfig& config, const RouterWeights& router, int layer) { plan_router(config, router, layer); }

Routing route_tokens(const ModelConfig& config, const RouterWeights& router, int layer, const bf16* hidden, int tokens,
                     numa::ThreadPool* pool) {
  RouterPlan p = plan_router(config, router, layer);
  if (tokens < 0) fail(ErrorKind::invalid_argument, where(layer) + "token count " + std::to_string(tokens) + " is negative");
  if (tokens > 0 && !hidden) fail(ErrorKind::invalid_argument, where(layer) + "no hidden states given for " + std::to_string(tokens) + " tokens");
  Routing r;
  r.tokens = tokens;
  r.top_k = p.top_k;
  r.expert_ids.resize(static_cast<std::size_t>(tokens) * p.top_k);
  r.weights.resize(r.expert_ids.size());
  auto one = [&](std::size_t t, int) {
    route_one(p, layer, static_cast<int>(t), hidden + t * p.hidden, r.expert_ids.data() + t * p.top_k, r.weights.data() + t * p.top_k);
  };
  if (pool && tokens > 1) {
    pool->parallel_for(static_cast<std::size_t>(tokens), one);
  } else {
    for (int t = 0; t < tokens; ++t) one(static_cast<std::size_t>(t), 0);
  }
  return r;
}

}  // namespace tilemoe
