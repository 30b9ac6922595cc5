/* tilemoe's C ABI: opaque handles, plain C types, status codes. No C++ exception crosses it.
 *
 *   tilemoe_runtime* rt;  tilemoe_layer* layer;
 *   if (tilemoe_runtime_create("auto", 0, &rt) != TILEMOE_OK) puts(tilemoe_last_error());
 *   tilemoe_layer_from_checkpoint(rt, "/models/dsv2-lite", 1, &options, &layer);
 *   tilemoe_layer_forward(layer, T, k, x, ids, w, out, TILEMOE_BF16);
 *
 * Every function returns TILEMOE_OK or an error status; the message (naming the argument, file,
 * layer or expert) is then in tilemoe_last_error(), per thread, until the next failing call on
 * that thread. A failed call changes nothing. bf16 values are passed as uint16_t bit patterns.
 * Semantics are those of the C++ API (tilemoe/moe_layer.hpp, tilemoe/runtime.hpp).
 */
#ifndef TILEMOE_C_API_H
#define TILEMOE_C_API_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define TILEMOE_API __attribute__((visibility("default")))
#else
#define TILEMOE_API
#endif

typedef enum tilemoe_status {
  TILEMOE_OK = 0,
  TILEMOE_INVALID_ARGUMENT = 1, /* shapes, ids, options given by the caller */
  TILEMOE_BAD_FILE = 2,         /* a missing, truncated or inconsistent file; non-finite weights */
  TILEMOE_UNSUPPORTED = 3,      /* valid, but not on this CPU or build (e.g. AMX without AMX) */
  TILEMOE_STATE = 4,            /* the wrong time: an empty cache stack, a full one, a failed task before */
  TILEMOE_OUT_OF_MEMORY = 5,
  TILEMOE_INTERNAL = 6
} tilemoe_status;

/* The two range enumerators make every int a valid value of the type, so that a caller's bad
 * value is an error status (TILEMOE_INVALID_ARGUMENT) rather than undefined behaviour in C++. */
typedef enum tilemoe_dtype {
  TILEMOE_BF16 = 0,
  TILEMOE_F32 = 1,
  TILEMOE_DTYPE_RANGE_MIN = -0x7fffffff - 1,
  TILEMOE_DTYPE_RANGE_MAX = 0x7fffffff
} tilemoe_dtype;

typedef struct tilemoe_runtime tilemoe_runtime;
typedef struct tilemoe_layer tilemoe_layer;
typedef uint64_t tilemoe_ticket;

TILEMOE_API const char* tilemoe_last_error(void);
TILEMOE_API const char* tilemoe_status_name(tilemoe_status status);
TILEMOE_API const char* tilemoe_version(void);

/* isa: "auto", "amx", "avx512", "avx2" or "portable" (NULL: "auto"); threads 0: one per core. */
TILEMOE_API tilemoe_status tilemoe_runtime_create(const char* isa, int threads, tilemoe_runtime** out);
TILEMOE_API void tilemoe_runtime_destroy(tilemoe_runtime* runtime); /* destroy its layers first */
TILEMOE_API const char* tilemoe_runtime_isa(const tilemoe_runtime* runtime);
TILEMOE_API int tilemoe_runtime_threads(const tilemoe_runtime* runtime);
TILEMOE_API tilemoe_status tilemoe_runtime_sync(tilemoe_runtime* runtime);
TILEMOE_API tilemoe_status tilemoe_runtime_wait(tilemoe_runtime* runtime, tilemoe_ticket ticket);

/* 0.2.0 appended swiglu_limit to tilemoe_layer_config, 0.3.0 swiglu_alpha and swiglu_up_offset:
 * callers built against an older header pass a smaller struct and must be rebuilt
 * (tilemoe_version() says which library is loaded). */
typedef struct tilemoe_layer_config {
  int num_experts, top_k, hidden, intermediate;
  int max_tokens;
  int lora_rank;
  double lora_alpha;
  int use_rslora;
  int max_cache_depth; /* 0: inference only */
  int weight_type;     /* 0: bf16, 1: int8 (a scale per output channel), 2: int4 (a scale per group_size inputs),
                          3: mxfp4 (E2M1 with a power-of-two scale per 32 inputs, bf16 activations; since 0.4.0) */
  int numa_nodes;      /* split over NUMA nodes: 0 or 1 none, N > 1 real or virtual nodes, -1 the machine's */
  int group_size;      /* int4: 32, 64 or 128 (0: 128) */
  int backward_weight_copy; /* 1: backward reads a Wᵀ copy of the bf16 weights (twice their memory, faster) */
  double swiglu_limit;      /* > 0: the experts clamp gate to <= it and up to [-it, it] before SwiGLU
                               (DeepSeek-V4); 0: none. A checkpoint layer reports its config.json's. */
  double swiglu_alpha;      /* gpt-oss's SwiGLU, (up + swiglu_up_offset) * gate * sigmoid(swiglu_alpha * gate)
                               after the clamps: gpt-oss 1.702; 0 (a zeroed struct) is 1, the plain SwiGLU */
  double swiglu_up_offset;  /* gpt-oss: 1; 0: none */
} tilemoe_layer_config;

/* gate, up: bf16 [E][I][H]; down: bf16 [E][H][I]. Packed here; the caller may free them after. */
TILEMOE_API tilemoe_status tilemoe_layer_create(tilemoe_runtime* runtime, const tilemoe_layer_config* config,
                                                const uint16_t* gate, const uint16_t* up, const uint16_t* down,
                                                tilemoe_layer** out);
/* The same with the experts of each projection *_stride elements apart (0: dense, I*H); each
   expert's matrix is dense. A stacked w13 / gate_up_proj [E][2I][H] (gate's rows first) is read in
   place as gate = w13, up = w13 + I*H, gate_stride = up_stride = 2*I*H. A stride under I*H
   (experts that would overlap) is TILEMOE_INVALID_ARGUMENT. */
TILEMOE_API tilemoe_status tilemoe_layer_create_strided(tilemoe_runtime* runtime, const tilemoe_layer_config* config,
                                                        const uint16_t* gate, size_t gate_stride, const uint16_t* up,
                                                        size_t up_stride, const uint16_t* down, size_t down_stride,
                                                        tilemoe_layer** out);
/* The same with the experts' biases (gpt-oss), each NULL for none, dense and copied here: gate_bias
   and up_bias bf16 [E][I], added to those products before the activation; down_bias bf16 [E][H],
   added to each expert's output before its routing weight. A non-finite bias is TILEMOE_BAD_FILE
   naming the expert. */
TILEMOE_API tilemoe_status tilemoe_layer_create_with_biases(tilemoe_runtime* runtime, const tilemoe_layer_config* config,
                                                            const uint16_t* gate, size_t gate_stride, const uint16_t* up,
                                                            size_t up_stride, const uint16_t* down, size_t down_stride,
                                                            const uint16_t* gate_bias, const uint16_t* up_bias,
                                                            const uint16_t* down_bias, tilemoe_layer** out);
typedef struct tilemoe_checkpoint_options {
  int max_tokens;
  int max_cache_depth;
  int lora_rank; /* the largest rank of sets given later; an adapter raises it to its own */
  double lora_alpha;
  int use_rslora;
  const char* adapter; /* PEFT directory or `tilemoe convert-lora` file, or NULL */
  int numa_nodes;      /* as in tilemoe_layer_config */
  int weight_type;     /* 0: bf16, 1: int8, 2: int4, 3: mxfp4, quantized at load (or the type of quantized_dir) */
  int group_size;      /* int4: 32, 64 or 128 (0: 128) */
  const char* quantized_dir; /* a `tilemoe quantize` directory of this checkpoint, or NULL */
  int backward_weight_copy;  /* as in tilemoe_layer_config */
} tilemoe_checkpoint_options;

/* Layer `layer` of a Hugging Face checkpoint directory (config.json + safetensors, sharded or not). */
TILEMOE_API tilemoe_status tilemoe_layer_from_checkpoint(tilemoe_runtime* runtime, const char* model_dir, int layer,
                                                         const tilemoe_checkpoint_options* options, tilemoe_layer** out);
TILEMOE_API void tilemoe_layer_destroy(tilemoe_layer* layer); /* waits for its queued tasks */
/* Fills *config with the layer's shape and limits. */
TILEMOE_API tilemoe_status tilemoe_layer_get_config(const tilemoe_layer* layer, tilemoe_layer_config* config);

/* x: bf16 [T][H]; expert_ids: int64 [T][k]; weights: f32 [T][k]; out: [T][H] of out_dtype. */
TILEMOE_API tilemoe_status tilemoe_layer_forward(tilemoe_layer* layer, int tokens, int top_k, const uint16_t* x,
                                                 const int64_t* expert_ids, const float* weights, void* out,
                                                 tilemoe_dtype out_dtype);
TILEMOE_API tilemoe_status tilemoe_layer_forward_sft(tilemoe_layer* layer, int tokens, int top_k, const uint16_t* x,
                                                     const int64_t* expert_ids, const float* weights, void* out,
                                                     tilemoe_dtype out_dtype, int save_for_backward);

/* LoRA A [E][rank][in] and B [E][out][rank] in f32 per projection, at the layer's lora_rank and
 * scale; a NULL pair leaves that projection without LoRA. Read in place at every call. */
typedef struct tilemoe_lora_weights {
  const float *gate_a, *gate_b, *up_a, *up_b, *down_a, *down_b;
} tilemoe_lora_weights;
typedef struct tilemoe_lora_grads {
  float *gate_a, *gate_b, *up_a, *up_b, *down_a, *down_b;
} tilemoe_lora_grads;

/* grad_output and grad_input share one dtype; grads may be NULL (no LoRA gradients wanted). */
TILEMOE_API tilemoe_status tilemoe_layer_backward(tilemoe_layer* layer, const void* grad_output, void* grad_input,
                                                  tilemoe_dtype dtype, const tilemoe_lora_grads* grads, int accumulate);
TILEMOE_API tilemoe_status tilemoe_layer_update_lora_weights(tilemoe_layer* layer, const tilemoe_lora_weights* weights);
/* The same with the factors' element type: TILEMOE_F32 (as above) or TILEMOE_BF16 (uint16_t bf16
 * bits, read in place: half the bytes at every call). Gradients have their own type
 * (tilemoe_lora_grads_typed). */
typedef struct tilemoe_lora_weights_typed {
  const void *gate_a, *gate_b, *up_a, *up_b, *down_a, *down_b;
  tilemoe_dtype dtype;
} tilemoe_lora_weights_typed;
TILEMOE_API tilemoe_status tilemoe_layer_update_lora_weights_typed(tilemoe_layer* layer, const tilemoe_lora_weights_typed* weights);
/* layer_index: the layer's index in the model, or -1 for a layer from a checkpoint. */
TILEMOE_API tilemoe_status tilemoe_layer_load_adapter(tilemoe_layer* layer, const char* path, int layer_index);
/* How a loaded adapter is held (AdapterStorage in lora.hpp): as its file stores the factors (bf16
 * when every factor tensor is BF16, else f32), always f32, or always bf16 (rounded to nearest even). */
typedef enum tilemoe_adapter_storage {
  TILEMOE_ADAPTER_AS_STORED = 0,
  TILEMOE_ADAPTER_F32 = 1,
  TILEMOE_ADAPTER_BF16 = 2,
  TILEMOE_ADAPTER_STORAGE_RANGE_MIN = -0x7fffffff - 1,
  TILEMOE_ADAPTER_STORAGE_RANGE_MAX = 0x7fffffff
} tilemoe_adapter_storage;
/* tilemoe_layer_load_adapter holding the adapter as `storage` asks. */
TILEMOE_API tilemoe_status tilemoe_layer_load_adapter_as(tilemoe_layer* layer, const char* path, int layer_index,
                                                         tilemoe_adapter_storage storage);
TILEMOE_API tilemoe_status tilemoe_layer_unload_adapter(tilemoe_layer* layer);
TILEMOE_API tilemoe_status tilemoe_layer_cached_forwards(const tilemoe_layer* layer, int* count);
/* The rank of each projection's current LoRA set (gate, up, down; 0: none): the shapes of grads. */
TILEMOE_API tilemoe_status tilemoe_layer_lora_ranks(const tilemoe_layer* layer, int ranks[3]);

/* Copies of one projection's LoRA set in use (0 gate, 1 up, 2 down; the caller's arrays or the held
 * adapter), after the layer's queued tasks: a [E][rank][in] and b [E][out][rank] of `dtype` (rank as
 * tilemoe_layer_lora_ranks gives it; an expert of a smaller rank in its adapter has zero padding),
 * scale [E] (0 where an expert has no LoRA) and present [E] (1 or 0). Any of a, b, scale and present
 * may be NULL (not wanted). A trainer starting from an adapter copies it out with this, then
 * trains its own arrays (tilemoe_layer_update_lora_weights_typed). */
TILEMOE_API tilemoe_status tilemoe_layer_copy_lora(const tilemoe_layer* layer, int projection, tilemoe_dtype dtype, void* a, void* b,
                                                   float* scale, uint8_t* present);

/* Where the held adapter keeps a projection's LoRA when PEFT stacked it over the experts
 * (PeftStackedKeys in lora.hpp): its A and B keys as NUL-terminated strings in the caller's buffers,
 * B's rows and this projection's first row among them; empty keys for a projection kept per expert,
 * without LoRA, or without an adapter. Gate and up with the same key_a share one A: a trainer steps
 * it with the sum of their gradients. A buffer too small is TILEMOE_INVALID_ARGUMENT naming the size
 * needed; any output may be NULL. */
TILEMOE_API tilemoe_status tilemoe_layer_adapter_stacked_keys(const tilemoe_layer* layer, int projection, char* key_a, size_t key_a_size,
                                                              char* key_b, size_t key_b_size, int* first_row, int* b_rows);
/* The step between a stacked projection's rows in B (since 0.3.0): rows first_row, first_row + step,
 * ...; 2 where gate's and up's are interleaved (gpt-oss's gate_up_proj), else 1 (also for a
 * projection kept per expert or without LoRA). */
TILEMOE_API tilemoe_status tilemoe_layer_adapter_stacked_row_step(const tilemoe_layer* layer, int projection, int* row_step);

/* Asynchronous forms: return at once with a ticket; errors come from wait or sync. Pointers must
 * stay valid until the task has finished. */
TILEMOE_API tilemoe_status tilemoe_layer_submit_forward_sft(tilemoe_layer* layer, int tokens, int top_k, const uint16_t* x,
                                                            const int64_t* expert_ids, const float* weights, void* out,
                                                            tilemoe_dtype out_dtype, int save_for_backward,
                                                            tilemoe_ticket* ticket);
TILEMOE_API tilemoe_status tilemoe_layer_submit_backward(tilemoe_layer* layer, const void* grad_output, void* grad_input,
                                                         tilemoe_dtype dtype, const tilemoe_lora_grads* grads,
                                                         int accumulate, tilemoe_ticket* ticket);

/* Backward writing LoRA gradients of another element type: TILEMOE_F32 (as tilemoe_lora_grads) or
 * TILEMOE_BF16 (uint16_t bf16 bits: a trainer's bf16 parameters; each element is computed in f32
 * and rounded once, also when accumulate adds to it). dtype above is grad_output's and grad_input's. */
typedef struct tilemoe_lora_grads_typed {
  void *gate_a, *gate_b, *up_a, *up_b, *down_a, *down_b;
  tilemoe_dtype dtype;
} tilemoe_lora_grads_typed;
TILEMOE_API tilemoe_status tilemoe_layer_backward_typed(tilemoe_layer* layer, const void* grad_output, void* grad_input,
                                                        tilemoe_dtype dtype, const tilemoe_lora_grads_typed* grads, int accumulate);
TILEMOE_API tilemoe_status tilemoe_layer_submit_backward_typed(tilemoe_layer* layer, const void* grad_output, void* grad_input,
                                                               tilemoe_dtype dtype, const tilemoe_lora_grads_typed* grads,
                                                               int accumulate, tilemoe_ticket* ticket);

/* The LoRA the layers use now, written as one PEFT adapter directory (adapter_config.json +
 * adapter_model.safetensors) for PEFT, vLLM or SGLang: tilemoe::save_peft_adapter
 * (tilemoe/peft_save.hpp) says where the key names come from. index: the layer's index in the
 * model, or -1 for the one it knows (a checkpoint layer's, or the index its adapter was loaded
 * at). No layer may change its LoRA set while the call runs. */
typedef struct tilemoe_peft_layer {
  const tilemoe_layer* layer;
  int index;
} tilemoe_peft_layer;
typedef enum tilemoe_peft_dtype {
  TILEMOE_PEFT_AS_HELD = 0, /* as each set stores its factors, f32 or bf16 */
  TILEMOE_PEFT_F32 = 1,
  TILEMOE_PEFT_BF16 = 2,
  TILEMOE_PEFT_DTYPE_RANGE_MIN = -0x7fffffff - 1,
  TILEMOE_PEFT_DTYPE_RANGE_MAX = 0x7fffffff
} tilemoe_peft_dtype;
typedef struct tilemoe_peft_save_options {
  tilemoe_peft_dtype dtype;
  /* For layers whose adapter and checkpoint give no names; NULL: the defaults,
   * "model.layers.{layer}.mlp.experts.{expert}" and gate_proj, up_proj, down_proj. */
  const char* experts_module;
  const char* projection_names[3];
  const char* base_model_name_or_path; /* NULL: none */
} tilemoe_peft_save_options;
/* options may be NULL (the defaults). Nothing is written when a status other than TILEMOE_OK
 * comes back. */
TILEMOE_API tilemoe_status tilemoe_save_peft_adapter(const char* dir, const tilemoe_peft_layer* layers, int count,
                                                     const tilemoe_peft_save_options* options);

/* AdamW over the caller's f32 arrays (tilemoe/adamw.hpp): torch.optim.AdamW's update of each
 * segment, with the segment's own step number (1 for the first update), on the runtime's threads
 * after the tasks already submitted. Nothing is updated when a status other than TILEMOE_OK
 * comes back. */
typedef struct tilemoe_adamw_options {
  double lr, beta1, beta2, eps, weight_decay;
} tilemoe_adamw_options;
typedef struct tilemoe_adamw_segment {
  float* param;
  const float* grad;
  float *exp_avg, *exp_avg_sq;
  size_t count;
  int64_t step;
} tilemoe_adamw_segment;
TILEMOE_API tilemoe_status tilemoe_adamw_step(tilemoe_runtime* runtime, const tilemoe_adamw_options* options,
                                              const tilemoe_adamw_segment* segments, size_t count);

#ifdef __cplusplus
}
#endif

#endif /* TILEMOE_C_API_H */
