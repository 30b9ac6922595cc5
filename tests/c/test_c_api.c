/* The C ABI from plain C: a layer from the caller's memory against a straightforward C loop of
 * the same MoE (with LoRA), bf16 and f32 outputs, forward_sft/backward and the async forms, a
 * layer from a fixture checkpoint with its adapter, and error statuses with their messages.
 * Usage: test_c_api <tests/data dir>. Exit 0 on success, 1 with a message on failure. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tilemoe/c_api.h"

static int failures = 0;
#define CHECK(cond)                                                   \
  do {                                                                \
    if (!(cond)) {                                                    \
      fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                     \
    }                                                                 \
  } while (0)
#define REQUIRE_OK(call)                                                                        \
  do {                                                                                          \
    tilemoe_status s_ = (call);                                                                 \
    if (s_ != TILEMOE_OK) {                                                                     \
      fprintf(stderr, "%s:%d: %s -> %s: %s\n", __FILE__, __LINE__, #call, tilemoe_status_name(s_), \
              tilemoe_last_error());                                                            \
      exit(1);                                                                                  \
    }                                                                                           \
  } while (0)

enum { E = 5, K = 2, H = 67, I = 45, T = 9, R = 3 };

static float bf16_to_f32(uint16_t v) {
  uint32_t bits = (uint32_t)v << 16;
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}
static uint16_t f32_to_bf16(float f) {
  uint32_t bits;
  memcpy(&bits, &f, sizeof bits);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return (uint16_t)(bits >> 16);
}

static unsigned rng_state = 12345u;
static float uniform(void) { /* in [-1, 1) */
  rng_state = rng_state * 1664525u + 1013904223u;
  return (float)((rng_state >> 8) & 0xffffff) / 8388608.0f - 1.0f;
}

/* y[o] = W v (W: [out][in] bf16) + s * B (A v) */
static void project(const uint16_t* w, const float* a, const float* b, double s, const double* v, int in, int out, double* y) {
  double av[R];
  for (int r = 0; r < R; ++r) {
    av[r] = 0;
    for (int i = 0; i < in; ++i) av[r] += (double)a[r * in + i] * v[i];
  }
  for (int o = 0; o < out; ++o) {
    double acc = 0;
    for (int i = 0; i < in; ++i) acc += (double)bf16_to_f32(w[o * in + i]) * v[i];
    for (int r = 0; r < R; ++r) acc += s * (double)b[o * R + r] * av[r];
    y[o] = acc;
  }
}

static double rel_error(const float* got, const double* want, int n) {
  double num = 0, den = 0;
  for (int i = 0; i < n; ++i) num += (got[i] - want[i]) * (got[i] - want[i]), den += want[i] * want[i];
  return sqrt(num / (den > 0 ? den : 1));
}

static void test_memory_layer(tilemoe_runtime* rt) {
  static uint16_t gate[E * I * H], up[E * I * H], down[E * H * I], x[T * H], out_b[T * H];
  static float ga[E * R * H], gb[E * I * R], ua[E * R * H], ub[E * I * R], da[E * R * I], db[E * H * R];
  static float out[T * H], w[T * K], grad_out[T * H], grad_in[T * H];
  static int64_t ids[T * K];
  static double want[T * H];
  for (int i = 0; i < E * I * H; ++i) gate[i] = f32_to_bf16(0.15f * uniform()), up[i] = f32_to_bf16(0.15f * uniform());
  for (int i = 0; i < E * H * I; ++i) down[i] = f32_to_bf16(0.15f * uniform());
  for (int i = 0; i < E * R * H; ++i) ga[i] = 0.1f * uniform(), ua[i] = 0.1f * uniform();
  for (int i = 0; i < E * I * R; ++i) gb[i] = 0.1f * uniform(), ub[i] = 0.1f * uniform();
  for (int i = 0; i < E * R * I; ++i) da[i] = 0.1f * uniform();
  for (int i = 0; i < E * H * R; ++i) db[i] = 0.1f * uniform();
  for (int i = 0; i < T * H; ++i) x[i] = f32_to_bf16(uniform()), grad_out[i] = uniform();
  for (int t = 0; t < T; ++t) {
    ids[t * K] = t % E;
    ids[t * K + 1] = t == 4 ? -1 : (t + 2) % E; /* -1: an expert that runs elsewhere */
    w[t * K] = 0.7f, w[t * K + 1] = 0.3f;
  }
  const double alpha = 6.0, s = alpha / R;

  /* Fields not named are 0: plain SwiGLU, bf16 weights, no rsLoRA. */
  tilemoe_layer_config cfg = {.num_experts = E, .top_k = K, .hidden = H, .intermediate = I, .max_tokens = T, .lora_rank = R,
                              .lora_alpha = alpha, .max_cache_depth = 1, .numa_nodes = 1};
  tilemoe_layer* layer = NULL;
  REQUIRE_OK(tilemoe_layer_create(rt, &cfg, gate, up, down, &layer));
  tilemoe_lora_weights lw = {ga, gb, ua, ub, da, db};
  REQUIRE_OK(tilemoe_layer_update_lora_weights(layer, &lw));
  { /* copied out as the layer reads them: the arrays, the config's scale, every expert */
    static float ca[E * R * I], cb[E * H * R], cs[E];
    static uint16_t ca16[E * R * I];
    uint8_t cp[E];
    REQUIRE_OK(tilemoe_layer_copy_lora(layer, 2, TILEMOE_F32, ca, cb, cs, cp));
    CHECK(memcmp(ca, da, sizeof da) == 0 && memcmp(cb, db, sizeof db) == 0);
    int all = 1;
    for (int e = 0; e < E; ++e) all = all && cp[e] == 1 && fabsf(cs[e] - (float)(6.0 / R)) < 1e-6f;
    CHECK(all);
    REQUIRE_OK(tilemoe_layer_copy_lora(layer, 2, TILEMOE_BF16, ca16, NULL, NULL, NULL));
    int rounded = 1;
    for (int i = 0; i < E * R * I; ++i) rounded = rounded && ca16[i] == f32_to_bf16(da[i]);
    CHECK(rounded);
    CHECK(tilemoe_layer_copy_lora(layer, 3, TILEMOE_F32, ca, NULL, NULL, NULL) == TILEMOE_INVALID_ARGUMENT);
    CHECK(strstr(tilemoe_last_error(), "projection 3") != NULL);
    CHECK(tilemoe_layer_copy_lora(layer, 0, (tilemoe_dtype)4, ca, NULL, NULL, NULL) == TILEMOE_INVALID_ARGUMENT);
  }

  for (int t = 0; t < T; ++t) {
    double v[H], g[I], u[I], h[I], y[H];
    for (int i = 0; i < H; ++i) v[i] = bf16_to_f32(x[t * H + i]), want[t * H + i] = 0;
    for (int j = 0; j < K; ++j) {
      int e = (int)ids[t * K + j];
      if (e < 0) continue;
      project(gate + e * I * H, ga + e * R * H, gb + e * I * R, s, v, H, I, g);
      project(up + e * I * H, ua + e * R * H, ub + e * I * R, s, v, H, I, u);
      for (int i = 0; i < I; ++i) h[i] = g[i] / (1 + exp(-g[i])) * u[i];
      project(down + e * H * I, da + e * R * I, db + e * H * R, s, h, I, H, y);
      for (int i = 0; i < H; ++i) want[t * H + i] += w[t * K + j] * y[i];
    }
  }
  REQUIRE_OK(tilemoe_layer_forward(layer, T, K, x, ids, w, out, TILEMOE_F32));
  CHECK(rel_error(out, want, T * H) <= 1e-2);
  REQUIRE_OK(tilemoe_layer_forward(layer, T, K, x, ids, w, out_b, TILEMOE_BF16));
  for (int i = 0; i < T * H; ++i) out[i] = bf16_to_f32(out_b[i]);
  CHECK(rel_error(out, want, T * H) <= 1e-2);

  /* The factors stored as bf16 (tilemoe_lora_weights_typed) give the bits of f32 factors that hold
   * the same values; an unknown dtype is refused and changes nothing. */
  {
    static const int sizes[6] = {E * R * H, E * I * R, E * R * H, E * I * R, E * R * I, E * H * R};
    const float* src[6] = {ga, gb, ua, ub, da, db};
    static float exact[6][E * I * R > E * R * H ? E * I * R : E * R * H];
    static uint16_t bits[6][E * I * R > E * R * H ? E * I * R : E * R * H];
    static float got32[T * H], got16[T * H];
    for (int f = 0; f < 6; ++f)
      for (int i = 0; i < sizes[f]; ++i) bits[f][i] = f32_to_bf16(src[f][i]), exact[f][i] = bf16_to_f32(bits[f][i]);
    tilemoe_lora_weights_typed t32 = {exact[0], exact[1], exact[2], exact[3], exact[4], exact[5], TILEMOE_F32};
    tilemoe_lora_weights_typed t16 = {bits[0], bits[1], bits[2], bits[3], bits[4], bits[5], TILEMOE_BF16};
    REQUIRE_OK(tilemoe_layer_update_lora_weights_typed(layer, &t32));
    REQUIRE_OK(tilemoe_layer_forward(layer, T, K, x, ids, w, got32, TILEMOE_F32));
    REQUIRE_OK(tilemoe_layer_update_lora_weights_typed(layer, &t16));
    REQUIRE_OK(tilemoe_layer_forward(layer, T, K, x, ids, w, got16, TILEMOE_F32));
    CHECK(memcmp(got32, got16, sizeof got32) == 0);
    CHECK(rel_error(got16, want, T * H) <= 1e-2);
    t16.dtype = (tilemoe_dtype)5;
    CHECK(tilemoe_layer_update_lora_weights_typed(layer, &t16) == TILEMOE_INVALID_ARGUMENT);
    CHECK(strstr(tilemoe_last_error(), "dtype 5") != NULL);
    REQUIRE_OK(tilemoe_layer_forward(layer, T, K, x, ids, w, got32, TILEMOE_F32));
    CHECK(memcmp(got32, got16, sizeof got32) == 0);
    /* Gradients in bf16 (tilemoe_lora_grads_typed): the f32 ones rounded once each. */
    static float g32[6][E * I * R > E * R * H ? E * I * R : E * R * H];
    static uint16_t g16[6][E * I * R > E * R * H ? E * I * R : E * R * H];
    static float dx32[T * H], dx16[T * H];
    tilemoe_lora_grads_typed gt32 = {g32[0], g32[1], g32[2], g32[3], g32[4], g32[5], TILEMOE_F32};
    tilemoe_lora_grads_typed gt16 = {g16[0], g16[1], g16[2], g16[3], g16[4], g16[5], TILEMOE_BF16};
    REQUIRE_OK(tilemoe_layer_forward_sft(layer, T, K, x, ids, w, got32, TILEMOE_F32, 1));
    REQUIRE_OK(tilemoe_layer_backward_typed(layer, grad_out, dx32, TILEMOE_F32, &gt32, 0));
    tilemoe_ticket tf = 0, tb = 0;
    REQUIRE_OK(tilemoe_layer_submit_forward_sft(layer, T, K, x, ids, w, got16, TILEMOE_F32, 1, &tf));
    REQUIRE_OK(tilemoe_layer_submit_backward_typed(layer, grad_out, dx16, TILEMOE_F32, &gt16, 0, &tb));
    REQUIRE_OK(tilemoe_runtime_sync(rt));
    CHECK(memcmp(dx32, dx16, sizeof dx32) == 0);
    int rounded = 1;
    double gnorm = 0;
    for (int f = 0; f < 6; ++f)
      for (int i = 0; i < sizes[f]; ++i) rounded &= g16[f][i] == f32_to_bf16(g32[f][i]), gnorm += fabs(g32[f][i]);
    CHECK(rounded);
    CHECK(gnorm > 0);
    gt16.dtype = (tilemoe_dtype)9;
    REQUIRE_OK(tilemoe_layer_forward_sft(layer, T, K, x, ids, w, got16, TILEMOE_F32, 1));
    CHECK(tilemoe_layer_backward_typed(layer, grad_out, dx16, TILEMOE_F32, &gt16, 0) == TILEMOE_INVALID_ARGUMENT);
    CHECK(strstr(tilemoe_last_error(), "dtype 9") != NULL);
    int saved = -1;
    REQUIRE_OK(tilemoe_layer_cached_forwards(layer, &saved));
    CHECK(saved == 1); /* the refused backward popped nothing */
    REQUIRE_OK(tilemoe_layer_backward(layer, grad_out, dx16, TILEMOE_F32, NULL, 0));
    REQUIRE_OK(tilemoe_layer_update_lora_weights(layer, &lw));
  }

  /* Training step, async: the backward runs after its forward_sft; sync reports nothing. */
  static float dga[E * R * H], dgb[E * I * R], dua[E * R * H], dub[E * I * R], dda[E * R * I], ddb[E * H * R];
  tilemoe_lora_grads grads = {dga, dgb, dua, dub, dda, ddb};
  tilemoe_ticket t1 = 0, t2 = 0;
  REQUIRE_OK(tilemoe_layer_submit_forward_sft(layer, T, K, x, ids, w, out, TILEMOE_F32, 1, &t1));
  REQUIRE_OK(tilemoe_layer_submit_backward(layer, grad_out, grad_in, TILEMOE_F32, &grads, 0, &t2));
  CHECK(t2 > t1);
  REQUIRE_OK(tilemoe_runtime_sync(rt));
  CHECK(rel_error(out, want, T * H) <= 1e-2);
  /* d loss / d(down B) is never zero for a routed expert here: a cheap sign that grads were written. */
  double norm = 0;
  for (int i = 0; i < E * H * R; ++i) norm += fabs(ddb[i]);
  CHECK(norm > 0);
  int cached = -1;
  REQUIRE_OK(tilemoe_layer_cached_forwards(layer, &cached));
  CHECK(cached == 0);

  /* Errors: a status, a message naming the problem, nothing changed. */
  int64_t bad_ids[T * K];
  memcpy(bad_ids, ids, sizeof bad_ids);
  bad_ids[7] = E;
  CHECK(tilemoe_layer_forward_sft(layer, T, K, x, bad_ids, w, out, TILEMOE_F32, 1) == TILEMOE_INVALID_ARGUMENT);
  CHECK(strstr(tilemoe_last_error(), "expert_ids[3][1]") != NULL);
  REQUIRE_OK(tilemoe_layer_cached_forwards(layer, &cached));
  CHECK(cached == 0);
  CHECK(tilemoe_layer_backward(layer, grad_out, grad_in, TILEMOE_F32, &grads, 0) == TILEMOE_STATE);
  CHECK(strstr(tilemoe_last_error(), "empty") != NULL);
  CHECK(tilemoe_layer_forward(layer, T + 1, K, x, ids, w, out, TILEMOE_F32) == TILEMOE_INVALID_ARGUMENT);
  CHECK(tilemoe_layer_forward(layer, T, K, x, ids, w, out, (tilemoe_dtype)7) == TILEMOE_INVALID_ARGUMENT);
  CHECK(tilemoe_layer_forward(layer, T, K, x, ids, w, out, (tilemoe_dtype)-1) == TILEMOE_INVALID_ARGUMENT);
  CHECK(tilemoe_layer_forward(NULL, T, K, x, ids, w, out, TILEMOE_F32) == TILEMOE_INVALID_ARGUMENT);

  /* A failed task stops the layer's later tasks until sync reports it. */
  REQUIRE_OK(tilemoe_layer_submit_forward_sft(layer, T, K, x, bad_ids, w, out, TILEMOE_F32, 1, &t1));
  REQUIRE_OK(tilemoe_layer_submit_backward(layer, grad_out, grad_in, TILEMOE_F32, &grads, 0, &t2));
  CHECK(tilemoe_runtime_sync(rt) == TILEMOE_INVALID_ARGUMENT);
  CHECK(strstr(tilemoe_last_error(), "expert_ids[3][1]") != NULL);
  REQUIRE_OK(tilemoe_runtime_sync(rt));

  tilemoe_layer_config bad = cfg;
  tilemoe_layer* none = NULL;
  bad.top_k = E + 1;
  CHECK(tilemoe_layer_create(rt, &bad, gate, up, down, &none) == TILEMOE_INVALID_ARGUMENT && none == NULL);
  bad = cfg;
  bad.weight_type = 2;
  bad.group_size = 48;
  CHECK(tilemoe_layer_create(rt, &bad, gate, up, down, &none) == TILEMOE_INVALID_ARGUMENT && none == NULL);
  CHECK(strstr(tilemoe_last_error(), "group_size 48") != NULL);
  bad.weight_type = 7;
  CHECK(tilemoe_layer_create(rt, &bad, gate, up, down, &none) == TILEMOE_INVALID_ARGUMENT && none == NULL);
  bad = cfg;
  bad.swiglu_limit = -1.0;
  CHECK(tilemoe_layer_create(rt, &bad, gate, up, down, &none) == TILEMOE_INVALID_ARGUMENT && none == NULL);
  CHECK(strstr(tilemoe_last_error(), "swiglu_limit") != NULL);
  /* A clamped SwiGLU (DeepSeek-V4's swiglu_limit): reported back, and a small limit changes the output. */
  {
    tilemoe_layer_config cc = cfg;
    cc.swiglu_limit = 0.05;
    tilemoe_layer* cl = NULL;
    REQUIRE_OK(tilemoe_layer_create(rt, &cc, gate, up, down, &cl));
    tilemoe_layer_config got;
    REQUIRE_OK(tilemoe_layer_get_config(cl, &got));
    CHECK(got.swiglu_limit == 0.05);
    float* clamped = (float*)malloc(sizeof(float) * T * H);
    float* plain = (float*)malloc(sizeof(float) * T * H);
    REQUIRE_OK(tilemoe_layer_forward(cl, T, K, x, ids, w, clamped, TILEMOE_F32));
    tilemoe_layer* pl = NULL;
    REQUIRE_OK(tilemoe_layer_create(rt, &cfg, gate, up, down, &pl));
    REQUIRE_OK(tilemoe_layer_get_config(pl, &got));
    CHECK(got.swiglu_limit == 0.0);
    REQUIRE_OK(tilemoe_layer_forward(pl, T, K, x, ids, w, plain, TILEMOE_F32));
    double most = 0;
    for (int i = 0; i < T * H; ++i) most = fabs(clamped[i] - plain[i]) > most ? fabs(clamped[i] - plain[i]) : most;
    CHECK(most > 1e-3);
    free(clamped);
    free(plain);
    tilemoe_layer_destroy(pl);
    tilemoe_layer_destroy(cl);
  }
  /* gpt-oss's SwiGLU and biases: reported back; zero biases and the plain form give the plain layer's
   * bits; a bias moves the output; a non-finite one is refused naming the expert. */
  {
    static uint16_t zero_gu[E * I], zero_d[E * H], bias_d[E * H];
    static float plain_out[T * H], biased_out[T * H];
    memset(zero_gu, 0, sizeof zero_gu);
    memset(zero_d, 0, sizeof zero_d);
    for (int i = 0; i < E * H; ++i) bias_d[i] = 0x3e80; /* 0.25 */
    tilemoe_layer *zb = NULL, *bl = NULL, *oss = NULL, *none2 = NULL;
    REQUIRE_OK(tilemoe_layer_create_with_biases(rt, &cfg, gate, 0, up, 0, down, 0, zero_gu, zero_gu, zero_d, &zb));
    REQUIRE_OK(tilemoe_layer_forward(zb, T, K, x, ids, w, biased_out, TILEMOE_F32));
    tilemoe_layer* pl = NULL;
    REQUIRE_OK(tilemoe_layer_create(rt, &cfg, gate, up, down, &pl));
    REQUIRE_OK(tilemoe_layer_forward(pl, T, K, x, ids, w, plain_out, TILEMOE_F32));
    CHECK(memcmp(plain_out, biased_out, sizeof plain_out) == 0);
    REQUIRE_OK(tilemoe_layer_create_with_biases(rt, &cfg, gate, 0, up, 0, down, 0, NULL, NULL, bias_d, &bl));
    REQUIRE_OK(tilemoe_layer_forward(bl, T, K, x, ids, w, biased_out, TILEMOE_F32));
    double most = 0;
    for (int i = 0; i < T * H; ++i) most = fabs(biased_out[i] - plain_out[i]) > most ? fabs(biased_out[i] - plain_out[i]) : most;
    CHECK(most > 0.1);
    tilemoe_layer_config oc = cfg;
    oc.swiglu_limit = 7.0;
    oc.swiglu_alpha = 1.702;
    oc.swiglu_up_offset = 1.0;
    REQUIRE_OK(tilemoe_layer_create_with_biases(rt, &oc, gate, 0, up, 0, down, 0, NULL, NULL, bias_d, &oss));
    tilemoe_layer_config got;
    REQUIRE_OK(tilemoe_layer_get_config(oss, &got));
    CHECK(got.swiglu_alpha == 1.702 && got.swiglu_up_offset == 1.0 && got.swiglu_limit == 7.0);
    REQUIRE_OK(tilemoe_layer_get_config(pl, &got));
    CHECK(got.swiglu_alpha == 1.0 && got.swiglu_up_offset == 0.0); /* a zeroed alpha is the plain form's 1 */
    bias_d[3 * H + 2] = 0x7fc0; /* NaN in expert 3's down bias */
    CHECK(tilemoe_layer_create_with_biases(rt, &oc, gate, 0, up, 0, down, 0, NULL, NULL, bias_d, &none2) == TILEMOE_BAD_FILE);
    CHECK(none2 == NULL && strstr(tilemoe_last_error(), "expert 3 down bias") != NULL);
    oc.swiglu_alpha = -1.0;
    CHECK(tilemoe_layer_create(rt, &oc, gate, up, down, &none2) == TILEMOE_INVALID_ARGUMENT && none2 == NULL);
    CHECK(strstr(tilemoe_last_error(), "swiglu_alpha") != NULL);
    tilemoe_layer_destroy(oss);
    tilemoe_layer_destroy(bl);
    tilemoe_layer_destroy(pl);
    tilemoe_layer_destroy(zb);
  }
  /* int8, int4 and mxfp4 layers from the same weights: quantized here, reported by get_config. */
  for (int type = 1; type <= 3; ++type) {
    tilemoe_layer_config qc = cfg;
    qc.weight_type = type;
    qc.group_size = type == 2 ? 32 : 0;
    tilemoe_layer* ql = NULL;
    REQUIRE_OK(tilemoe_layer_create(rt, &qc, gate, up, down, &ql));
    tilemoe_layer_config got;
    REQUIRE_OK(tilemoe_layer_get_config(ql, &got));
    CHECK(got.weight_type == type && (type == 1 || got.group_size == 32));
    REQUIRE_OK(tilemoe_layer_forward(ql, T, K, x, ids, w, out, TILEMOE_F32));
    tilemoe_layer_destroy(ql);
  }
  /* gate and up stacked as one w13 [E][2I][H] and down E matrices 5 elements apart, read in
   * place: the same bits as the dense arrays; a stride that would overlap experts is refused. */
  {
    static uint16_t w13[E * 2 * I * H], down_spaced[E * (H * I + 5)];
    static float dense_out[T * H], strided_out[T * H];
    for (int e = 0; e < E; ++e) {
      memcpy(w13 + (size_t)e * 2 * I * H, gate + (size_t)e * I * H, sizeof(uint16_t) * I * H);
      memcpy(w13 + (size_t)e * 2 * I * H + I * H, up + (size_t)e * I * H, sizeof(uint16_t) * I * H);
      memcpy(down_spaced + (size_t)e * (H * I + 5), down + (size_t)e * H * I, sizeof(uint16_t) * H * I);
    }
    tilemoe_layer *strided = NULL, *spoiled = NULL;
    REQUIRE_OK(tilemoe_layer_create_strided(rt, &cfg, w13, 2 * I * H, w13 + I * H, 2 * I * H, down_spaced, H * I + 5, &strided));
    REQUIRE_OK(tilemoe_layer_update_lora_weights(strided, &lw));
    REQUIRE_OK(tilemoe_layer_forward(layer, T, K, x, ids, w, dense_out, TILEMOE_F32));
    REQUIRE_OK(tilemoe_layer_forward(strided, T, K, x, ids, w, strided_out, TILEMOE_F32));
    CHECK(memcmp(dense_out, strided_out, sizeof dense_out) == 0);
    CHECK(tilemoe_layer_create_strided(rt, &cfg, w13, 2 * I * H, w13 + I * H, I * H - 1, down, 0, &spoiled) == TILEMOE_INVALID_ARGUMENT);
    CHECK(spoiled == NULL);
    CHECK(strstr(tilemoe_last_error(), "up_stride") != NULL);
    tilemoe_layer_destroy(strided);
  }
  /* The backward's Wᵀ weight copy: the same gradients, bit for bit; refused for int8 weights. */
  {
    tilemoe_layer_config cc = cfg;
    cc.backward_weight_copy = 1;
    tilemoe_layer *plain = NULL, *copied = NULL;
    REQUIRE_OK(tilemoe_layer_create(rt, &cfg, gate, up, down, &plain));
    REQUIRE_OK(tilemoe_layer_create(rt, &cc, gate, up, down, &copied));
    tilemoe_layer_config got;
    REQUIRE_OK(tilemoe_layer_get_config(copied, &got));
    CHECK(got.backward_weight_copy == 1);
    float gi[2][T * H];
    tilemoe_layer* both[2] = {plain, copied};
    for (int l = 0; l < 2; ++l) {
      REQUIRE_OK(tilemoe_layer_forward_sft(both[l], T, K, x, ids, w, out, TILEMOE_F32, 1));
      REQUIRE_OK(tilemoe_layer_backward(both[l], grad_out, gi[l], TILEMOE_F32, NULL, 0));
    }
    CHECK(memcmp(gi[0], gi[1], sizeof gi[0]) == 0);
    tilemoe_layer_destroy(plain);
    tilemoe_layer_destroy(copied);
    cc.weight_type = 1;
    CHECK(tilemoe_layer_create(rt, &cc, gate, up, down, &none) == TILEMOE_INVALID_ARGUMENT && none == NULL);
    CHECK(strstr(tilemoe_last_error(), "backward_weight_copy") != NULL);
  }
  gate[3 * I * H + 5] = 0x7f80; /* +Inf in expert 3's gate */
  CHECK(tilemoe_layer_create(rt, &cfg, gate, up, down, &none) == TILEMOE_BAD_FILE);
  CHECK(strstr(tilemoe_last_error(), "expert 3 gate") != NULL);
  tilemoe_layer_destroy(layer);
}

static void test_checkpoint_layer(tilemoe_runtime* rt, const char* data) {
  char model[1024], adapter[1024];
  snprintf(model, sizeof model, "%s/deepseek_tiny/model", data);
  snprintf(adapter, sizeof adapter, "%s/deepseek_tiny/adapter", data);
  tilemoe_checkpoint_options opt = {16, 1, 0, 0.0, 0, adapter, 1, 0, 0, NULL, 0};
  tilemoe_layer* layer = NULL;
  REQUIRE_OK(tilemoe_layer_from_checkpoint(rt, model, 1, &opt, &layer));
  tilemoe_layer_config cfg;
  REQUIRE_OK(tilemoe_layer_get_config(layer, &cfg));
  CHECK(cfg.hidden == 320 && cfg.intermediate == 176 && cfg.num_experts == 8 && cfg.top_k == 2);
  int ranks[3];
  REQUIRE_OK(tilemoe_layer_lora_ranks(layer, ranks));
  CHECK(ranks[0] == 8 && ranks[1] == 8 && ranks[2] == 8);
  REQUIRE_OK(tilemoe_layer_unload_adapter(layer));
  REQUIRE_OK(tilemoe_layer_lora_ranks(layer, ranks));
  CHECK(ranks[0] == 0);
  /* Held as asked: the fixture's BF16 adapter in f32 or bf16 gives the same output, bit for bit. */
  {
    enum { T = 3, K = 2 };
    uint16_t x[T * 320];
    int64_t ids[T * K] = {0, 5, 7, 2, 3, 3 - 4};
    float w[T * K] = {0.25f, 0.75f, 0.5f, 0.5f, 1.0f, 0.0f}, out[3][T * 320];
    for (int i = 0; i < T * 320; ++i) x[i] = (uint16_t)(0x3c00 + (i * 37) % 512);
    const tilemoe_adapter_storage storages[3] = {TILEMOE_ADAPTER_AS_STORED, TILEMOE_ADAPTER_F32, TILEMOE_ADAPTER_BF16};
    for (int s = 0; s < 3; ++s) {
      REQUIRE_OK(tilemoe_layer_load_adapter_as(layer, adapter, 1, storages[s]));
      REQUIRE_OK(tilemoe_layer_forward(layer, T, K, x, ids, w, out[s], TILEMOE_F32));
    }
    CHECK(memcmp(out[0], out[1], sizeof out[0]) == 0 && memcmp(out[0], out[2], sizeof out[0]) == 0);
    CHECK(tilemoe_layer_load_adapter_as(layer, adapter, 1, (tilemoe_adapter_storage)3) == TILEMOE_INVALID_ARGUMENT);
    CHECK(strstr(tilemoe_last_error(), "storage 3") != NULL);
    REQUIRE_OK(tilemoe_layer_lora_ranks(layer, ranks));
    CHECK(ranks[0] == 8); /* the refused call kept the adapter loaded before it */

    /* The held adapter copied out: its bf16 factors exactly in f32 and bf16, every expert covered. */
    {
      static float ga32[8 * 8 * 320], scales[8];
      static uint16_t ga16[8 * 8 * 320];
      uint8_t covered[8];
      REQUIRE_OK(tilemoe_layer_copy_lora(layer, 0, TILEMOE_F32, ga32, NULL, scales, covered));
      REQUIRE_OK(tilemoe_layer_copy_lora(layer, 0, TILEMOE_BF16, ga16, NULL, NULL, NULL));
      int same = 1, nonzero = 0;
      for (int i = 0; i < 8 * 8 * 320; ++i) same = same && f32_to_bf16(ga32[i]) == ga16[i] && bf16_to_f32(ga16[i]) == ga32[i], nonzero += ga32[i] != 0;
      CHECK(same && nonzero > 0);
      for (int e = 0; e < 8; ++e) CHECK(covered[e] == 1 && scales[e] > 0);
    }
    /* Written back as a PEFT adapter and loaded again: the same output, bit for bit. */
    char tmp[] = "/tmp/tilemoe_c_api_XXXXXX", saved[1100];
    REQUIRE_OK(mkdtemp(tmp) ? TILEMOE_OK : TILEMOE_INTERNAL);
    snprintf(saved, sizeof saved, "%s/adapter", tmp);
    const tilemoe_peft_layer list[1] = {{layer, -1}};
    REQUIRE_OK(tilemoe_save_peft_adapter(saved, list, 1, NULL));
    float again[T * 320];
    REQUIRE_OK(tilemoe_layer_load_adapter(layer, saved, 1));
    REQUIRE_OK(tilemoe_layer_forward(layer, T, K, x, ids, w, again, TILEMOE_F32));
    CHECK(memcmp(out[0], again, sizeof again) == 0);
    tilemoe_peft_save_options so = {(tilemoe_peft_dtype)7, NULL, {NULL, NULL, NULL}, NULL};
    CHECK(tilemoe_save_peft_adapter(saved, list, 1, &so) == TILEMOE_INVALID_ARGUMENT);
    CHECK(strstr(tilemoe_last_error(), "dtype 7") != NULL);
    CHECK(tilemoe_save_peft_adapter(saved, list, 0, NULL) == TILEMOE_INVALID_ARGUMENT);
    const tilemoe_peft_layer wrong[1] = {{layer, 3}};
    CHECK(tilemoe_save_peft_adapter(saved, wrong, 1, NULL) == TILEMOE_INVALID_ARGUMENT);
    CHECK(strstr(tilemoe_last_error(), "index 3 given, but the layer is layer 1") != NULL);
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    CHECK(system(cmd) == 0);
  }
  tilemoe_layer_destroy(layer);

  opt.adapter = NULL;
  CHECK(tilemoe_layer_from_checkpoint(rt, model, 0, &opt, &layer) == TILEMOE_INVALID_ARGUMENT);
  CHECK(strstr(tilemoe_last_error(), "layer 0") != NULL);
  CHECK(tilemoe_layer_from_checkpoint(rt, "/nonexistent/model", 1, &opt, &layer) == TILEMOE_BAD_FILE);
  CHECK(strstr(tilemoe_last_error(), "/nonexistent/model") != NULL);
}

/* AdamW: two segments at different step numbers against the formula in double; a bad option or
 * a null array is refused with the option or segment named, and nothing is updated. */
static void test_adamw(tilemoe_runtime* rt) {
  enum { N = 37 };
  float p[N], g[N], m[N], v[N];
  double pd[N], md[N], vd[N];
  for (int i = 0; i < N; ++i) {
    p[i] = uniform(), g[i] = 0.01f * uniform(), m[i] = 0.001f * uniform(), v[i] = 1e-5f * (uniform() + 1.0f);
    pd[i] = p[i], md[i] = m[i], vd[i] = v[i];
  }
  const tilemoe_adamw_options o = {2e-3, 0.9, 0.999, 1e-8, 0.05};
  tilemoe_adamw_segment segs[2] = {{p, g, m, v, 20, 1}, {p + 20, g + 20, m + 20, v + 20, N - 20, 7}};
  tilemoe_adamw_options bad = o;
  bad.beta2 = 1.0;
  float p_before = p[0];
  CHECK(tilemoe_adamw_step(rt, &bad, segs, 2) == TILEMOE_INVALID_ARGUMENT);
  CHECK(strstr(tilemoe_last_error(), "beta2") != NULL);
  segs[1].grad = NULL;
  CHECK(tilemoe_adamw_step(rt, &o, segs, 2) == TILEMOE_INVALID_ARGUMENT);
  CHECK(strstr(tilemoe_last_error(), "segment 1") != NULL);
  CHECK(p[0] == p_before);
  segs[1].grad = g + 20;
  REQUIRE_OK(tilemoe_adamw_step(rt, &o, segs, 2));
  double worst = 0;
  for (int i = 0; i < N; ++i) {
    const double t = i < 20 ? 1 : 7;
    pd[i] *= 1 - o.lr * o.weight_decay;
    md[i] += (1 - o.beta1) * (g[i] - md[i]);
    vd[i] = o.beta2 * vd[i] + (1 - o.beta2) * (double)g[i] * g[i];
    pd[i] -= o.lr / (1 - pow(o.beta1, t)) * md[i] / (sqrt(vd[i]) / sqrt(1 - pow(o.beta2, t)) + o.eps);
    const double d = fabs(p[i] - pd[i]) / (fabs(pd[i]) + o.lr);
    if (d > worst) worst = d;
  }
  CHECK(worst < 1e-5);
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: test_c_api <tests/data dir>\n");
    return 2;
  }
  tilemoe_runtime* rt = NULL;
  CHECK(tilemoe_runtime_create("no-such-isa", 0, &rt) == TILEMOE_INVALID_ARGUMENT && rt == NULL);
  REQUIRE_OK(tilemoe_runtime_create(NULL, 0, &rt));
  printf("tilemoe %s, isa %s, %d threads\n", tilemoe_version(), tilemoe_runtime_isa(rt), tilemoe_runtime_threads(rt));
  test_memory_layer(rt);
  test_checkpoint_layer(rt, argv[1]);
  test_adamw(rt);
  tilemoe_runtime_destroy(rt);
  if (failures) fprintf(stderr, "%d check(s) failed\n", failures);
  else printf("all C ABI checks passed\n");
  return failures ? 1 : 0;
}
