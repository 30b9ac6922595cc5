// The C ABI over the C++ API: every entry point catches everything, stores the message per
// thread and returns a status, so no exception crosses into C, Python or Rust.
#include "tilemoe/c_api.h"

#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "src/api/layer_peft_state.hpp"
#include "src/lora/lora_view.hpp"
#include "tilemoe/adamw.hpp"
#include "tilemoe/bf16.hpp"
#include "tilemoe/error.hpp"
#include "tilemoe/moe_layer.hpp"
#include "tilemoe/peft_save.hpp"

struct tilemoe_runtime {
  tilemoe::Runtime rt;
};
struct tilemoe_layer {
  tilemoe::MoeLayer layer;
};

namespace {

thread_local std::string last_error;

tilemoe_status status_of(tilemoe::ErrorKind kind) {
  switch (kind) {
    case tilemoe::ErrorKind::invalid_argument: return TILEMOE_INVALID_ARGUMENT;
    case tilemoe::ErrorKind::bad_file: return TILEMOE_BAD_FILE;
    case tilemoe::ErrorKind::unsupported: return TILEMOE_UNSUPPORTED;
    case tilemoe::ErrorKind::state: return TILEMOE_STATE;
  }
  return TILEMOE_INTERNAL;
}

template <typename F>
tilemoe_status guard(F&& f) {
  try {
    f();
    return TILEMOE_OK;
  } catch (const tilemoe::Error& e) {
    last_error = e.what();
    return status_of(e.kind());
  } catch (const std::bad_alloc&) {
    last_error = "out of memory";
    return TILEMOE_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    last_error = e.what();
    return TILEMOE_INTERNAL;
  } catch (...) {
    last_error = "an unknown C++ exception";
    return TILEMOE_INTERNAL;
  }
}

void require(bool ok, const char* what) {
  if (!ok) tilemoe::fail(tilemoe::ErrorKind::invalid_argument, what);
}
void require(bool ok, const std::string& what) {
  if (!ok) tilemoe::fail(tilemoe::ErrorKind::invalid_argument, what);
}

tilemoe::LoraGrads grads_of(const tilemoe_lora_grads* g) {
  if (!g) return {};
  return {g->gate_a, g->gate_b, g->up_a, g->up_b, g->down_a, g->down_b};
}

void check_dtype(tilemoe_dtype d, const char* who) {
  if (d != TILEMOE_BF16 && d != TILEMOE_F32)
    tilemoe::fail(tilemoe::ErrorKind::invalid_argument, std::string(who) + ": dtype " + std::to_string(static_cast<int>(d)) +
                                                            " is neither TILEMOE_BF16 (0) nor TILEMOE_F32 (1)");
}

}  // namespace

extern "C" {

const char* tilemoe_last_error(void) { return last_error.c_str(); }

const char* tilemoe_status_name(tilemoe_status status) {
  switch (status) {
    case TILEMOE_OK: return "ok";
    case TILEMOE_INVALID_ARGUMENT: return "invalid argument";
    case TILEMOE_BAD_FILE: return "bad file";
    case TILEMOE_UNSUPPORTED: return "unsupported";
    case TILEMOE_STATE: return "state";
    case TILEMOE_OUT_OF_MEMORY: return "out of memory";
    case TILEMOE_INTERNAL: return "internal";
  }
  return "unknown status";
}

const char* tilemoe_version(void) { return "0.4.0"; }  // CMakeLists.txt's project VERSION

tilemoe_status tilemoe_runtime_create(const char* isa, int threads, tilemoe_runtime** out) {
  return guard([&] {
    require(out != nullptr, "tilemoe_runtime_create: out is NULL");
    *out = nullptr;
    *out = new tilemoe_runtime{tilemoe::Runtime({isa ? isa : "auto", threads})};
  });
}

void tilemoe_runtime_destroy(tilemoe_runtime* runtime) { delete runtime; }

const char* tilemoe_runtime_isa(const tilemoe_runtime* runtime) { return runtime ? runtime->rt.isa() : ""; }
int tilemoe_runtime_threads(const tilemoe_runtime* runtime) { return runtime ? runtime->rt.threads() : 0; }

tilemoe_status tilemoe_runtime_sync(tilemoe_runtime* runtime) {
  return guard([&] {
    require(runtime != nullptr, "tilemoe_runtime_sync: runtime is NULL");
    runtime->rt.sync();
  });
}

tilemoe_status tilemoe_runtime_wait(tilemoe_runtime* runtime, tilemoe_ticket ticket) {
  return guard([&] {
    require(runtime != nullptr, "tilemoe_runtime_wait: runtime is NULL");
    runtime->rt.wait(ticket);
  });
}

namespace {
tilemoe::WeightType weight_type_of(int v, const char* who) {
  switch (v) {
    case 0: return tilemoe::WeightType::bf16;
    case 1: return tilemoe::WeightType::int8;
    case 2: return tilemoe::WeightType::int4;
    case 3: return tilemoe::WeightType::mxfp4;
  }
  tilemoe::fail(tilemoe::ErrorKind::invalid_argument,
                std::string(who) + ": weight_type " + std::to_string(v) + " is not 0 (bf16), 1 (int8), 2 (int4) or 3 (mxfp4)");
}
}  // namespace

tilemoe_status tilemoe_layer_create(tilemoe_runtime* runtime, const tilemoe_layer_config* config, const uint16_t* gate,
                                    const uint16_t* up, const uint16_t* down, tilemoe_layer** out) {
  return tilemoe_layer_create_strided(runtime, config, gate, 0, up, 0, down, 0, out);
}

tilemoe_status tilemoe_layer_create_strided(tilemoe_runtime* runtime, const tilemoe_layer_config* config, const uint16_t* gate,
                                            size_t gate_stride, const uint16_t* up, size_t up_stride, const uint16_t* down,
                                            size_t down_stride, tilemoe_layer** out) {
  return tilemoe_layer_create_with_biases(runtime, config, gate, gate_stride, up, up_stride, down, down_stride, nullptr, nullptr, nullptr,
                                          out);
}

tilemoe_status tilemoe_layer_create_with_biases(tilemoe_runtime* runtime, const tilemoe_layer_config* config, const uint16_t* gate,
                                                size_t gate_stride, const uint16_t* up, size_t up_stride, const uint16_t* down,
                                                size_t down_stride, const uint16_t* gate_bias, const uint16_t* up_bias,
                                                const uint16_t* down_bias, tilemoe_layer** out) {
  return guard([&] {
    require(runtime && config && out, "tilemoe_layer_create: runtime, config and out must not be NULL");
    *out = nullptr;
    tilemoe::MoeLayerConfig c;
    c.num_experts = config->num_experts;
    c.top_k = config->top_k;
    c.hidden = config->hidden;
    c.intermediate = config->intermediate;
    c.max_tokens = config->max_tokens;
    c.lora_rank = config->lora_rank;
    c.lora_alpha = config->lora_alpha;
    c.use_rslora = config->use_rslora != 0;
    c.max_cache_depth = config->max_cache_depth;
    c.weight_type = weight_type_of(config->weight_type, "tilemoe_layer_create");
    c.group_size = config->group_size == 0 ? 128 : config->group_size;
    c.numa_nodes = config->numa_nodes == 0 ? 1 : config->numa_nodes == -1 ? 0 : config->numa_nodes;  // -1: the machine's
    c.backward_weight_copy = config->backward_weight_copy != 0;
    c.swiglu_limit = config->swiglu_limit;
    c.swiglu_alpha = config->swiglu_alpha == 0 ? 1.0 : config->swiglu_alpha;
    c.swiglu_up_offset = config->swiglu_up_offset;
    *out = new tilemoe_layer{
        tilemoe::MoeLayer(runtime->rt, c, {gate, up, down, gate_stride, up_stride, down_stride, gate_bias, up_bias, down_bias})};
  });
}

tilemoe_status tilemoe_layer_from_checkpoint(tilemoe_runtime* runtime, const char* model_dir, int layer,
                                             const tilemoe_checkpoint_options* options, tilemoe_layer** out) {
  return guard([&] {
    require(runtime && model_dir && options && out,
            "tilemoe_layer_from_checkpoint: runtime, model_dir, options and out must not be NULL");
    *out = nullptr;
    tilemoe::CheckpointLayerOptions o;
    o.max_tokens = options->max_tokens;
    o.max_cache_depth = options->max_cache_depth;
    o.lora_rank = options->lora_rank;
    o.lora_alpha = options->lora_alpha;
    o.use_rslora = options->use_rslora != 0;
    if (options->adapter) o.adapter = options->adapter;
    o.numa_nodes = options->numa_nodes == 0 ? 1 : options->numa_nodes == -1 ? 0 : options->numa_nodes;
    o.weight_type = weight_type_of(options->weight_type, "tilemoe_layer_from_checkpoint");
    o.group_size = options->group_size == 0 ? 128 : options->group_size;
    if (options->quantized_dir) o.quantized_dir = options->quantized_dir;
    o.backward_weight_copy = options->backward_weight_copy != 0;
    *out = new tilemoe_layer{tilemoe::MoeLayer::from_checkpoint(runtime->rt, model_dir, layer, o)};
  });
}

void tilemoe_layer_destroy(tilemoe_layer* layer) { delete layer; }

tilemoe_status tilemoe_layer_get_config(const tilemoe_layer* layer, tilemoe_layer_config* config) {
  return guard([&] {
    require(layer && config, "tilemoe_layer_get_config: layer and config must not be NULL");
    const tilemoe::MoeLayerConfig& c = layer->layer.config();
    *config = {c.num_experts, c.top_k, c.hidden, c.intermediate, c.max_tokens, c.lora_rank, c.lora_alpha,
               c.use_rslora ? 1 : 0, c.max_cache_depth, static_cast<int>(c.weight_type), c.numa_nodes, c.group_size,
               c.backward_weight_copy ? 1 : 0, c.swiglu_limit, c.swiglu_alpha, c.swiglu_up_offset};
  });
}

tilemoe_status tilemoe_layer_forward(tilemoe_layer* layer, int tokens, int top_k, const uint16_t* x, const int64_t* expert_ids,
                                     const float* weights, void* out, tilemoe_dtype out_dtype) {
  return tilemoe_layer_forward_sft(layer, tokens, top_k, x, expert_ids, weights, out, out_dtype, 0);
}

tilemoe_status tilemoe_layer_forward_sft(tilemoe_layer* layer, int tokens, int top_k, const uint16_t* x,
                                         const int64_t* expert_ids, const float* weights, void* out, tilemoe_dtype out_dtype,
                                         int save_for_backward) {
  return guard([&] {
    require(layer != nullptr, "tilemoe_layer_forward: layer is NULL");
    check_dtype(out_dtype, "tilemoe_layer_forward");
    if (out_dtype == TILEMOE_BF16)
      layer->layer.forward_sft(tokens, top_k, x, expert_ids, weights, static_cast<uint16_t*>(out), save_for_backward != 0);
    else
      layer->layer.forward_sft(tokens, top_k, x, expert_ids, weights, static_cast<float*>(out), save_for_backward != 0);
  });
}

namespace {

tilemoe::LoraGrads typed_grads_of(const tilemoe_lora_grads_typed* g, const char* who) {
  if (!g) return {};
  check_dtype(g->dtype, who);
  return {g->gate_a, g->gate_b, g->up_a, g->up_b, g->down_a, g->down_b,
          g->dtype == TILEMOE_BF16 ? tilemoe::LoraDType::bf16 : tilemoe::LoraDType::f32};
}

void run_backward(tilemoe_layer* layer, const void* grad_output, void* grad_input, tilemoe_dtype dtype, const tilemoe::LoraGrads& grads,
                  int accumulate) {
  if (dtype == TILEMOE_BF16)
    layer->layer.backward(static_cast<const uint16_t*>(grad_output), static_cast<uint16_t*>(grad_input), grads, accumulate != 0);
  else
    layer->layer.backward(static_cast<const float*>(grad_output), static_cast<float*>(grad_input), grads, accumulate != 0);
}

tilemoe_ticket submit_backward(tilemoe_layer* layer, const void* grad_output, void* grad_input, tilemoe_dtype dtype,
                               const tilemoe::LoraGrads& grads, int accumulate) {
  if (dtype == TILEMOE_BF16)
    return layer->layer.submit_backward(static_cast<const uint16_t*>(grad_output), static_cast<uint16_t*>(grad_input), grads,
                                        accumulate != 0);
  return layer->layer.submit_backward(static_cast<const float*>(grad_output), static_cast<float*>(grad_input), grads, accumulate != 0);
}

}  // namespace

tilemoe_status tilemoe_layer_backward(tilemoe_layer* layer, const void* grad_output, void* grad_input, tilemoe_dtype dtype,
                                      const tilemoe_lora_grads* grads, int accumulate) {
  return guard([&] {
    require(layer != nullptr, "tilemoe_layer_backward: layer is NULL");
    check_dtype(dtype, "tilemoe_layer_backward");
    run_backward(layer, grad_output, grad_input, dtype, grads_of(grads), accumulate);
  });
}

tilemoe_status tilemoe_layer_backward_typed(tilemoe_layer* layer, const void* grad_output, void* grad_input, tilemoe_dtype dtype,
                                            const tilemoe_lora_grads_typed* grads, int accumulate) {
  return guard([&] {
    require(layer != nullptr, "tilemoe_layer_backward_typed: layer is NULL");
    check_dtype(dtype, "tilemoe_layer_backward_typed");
    run_backward(layer, grad_output, grad_input, dtype, typed_grads_of(grads, "tilemoe_layer_backward_typed: grads"), accumulate);
  });
}

tilemoe_status tilemoe_layer_update_lora_weights(tilemoe_layer* layer, const tilemoe_lora_weights* w) {
  return guard([&] {
    require(layer != nullptr, "tilemoe_layer_update_lora_weights: layer is NULL");
    tilemoe::LoraWeights lw;
    if (w) lw = {w->gate_a, w->gate_b, w->up_a, w->up_b, w->down_a, w->down_b};
    layer->layer.update_lora_weights(lw);
  });
}

tilemoe_status tilemoe_layer_update_lora_weights_typed(tilemoe_layer* layer, const tilemoe_lora_weights_typed* w) {
  return guard([&] {
    require(layer != nullptr, "tilemoe_layer_update_lora_weights_typed: layer is NULL");
    tilemoe::LoraWeights lw;
    if (w) {
      check_dtype(w->dtype, "tilemoe_layer_update_lora_weights_typed");
      lw = {w->gate_a, w->gate_b, w->up_a, w->up_b, w->down_a, w->down_b,
            w->dtype == TILEMOE_BF16 ? tilemoe::LoraDType::bf16 : tilemoe::LoraDType::f32};
    }
    layer->layer.update_lora_weights(lw);
  });
}

tilemoe_status tilemoe_layer_load_adapter(tilemoe_layer* layer, const char* path, int layer_index) {
  return guard([&] {
    require(layer && path, "tilemoe_layer_load_adapter: layer and path must not be NULL");
    layer->layer.load_adapter(path, layer_index);
  });
}

tilemoe_status tilemoe_layer_load_adapter_as(tilemoe_layer* layer, const char* path, int layer_index,
                                            tilemoe_adapter_storage storage) {
  return guard([&] {
    require(layer && path, "tilemoe_layer_load_adapter_as: layer and path must not be NULL");
    require(storage == TILEMOE_ADAPTER_AS_STORED || storage == TILEMOE_ADAPTER_F32 || storage == TILEMOE_ADAPTER_BF16,
            "tilemoe_layer_load_adapter_as: storage " + std::to_string(static_cast<long long>(storage)) +
                " is not TILEMOE_ADAPTER_AS_STORED, TILEMOE_ADAPTER_F32 or TILEMOE_ADAPTER_BF16");
    const tilemoe::AdapterStorage s = storage == TILEMOE_ADAPTER_F32    ? tilemoe::AdapterStorage::f32
                                      : storage == TILEMOE_ADAPTER_BF16 ? tilemoe::AdapterStorage::bf16
                                                                        : tilemoe::AdapterStorage::as_stored;
    layer->layer.load_adapter(path, layer_index, s);
  });
}

tilemoe_status tilemoe_save_peft_adapter(const char* dir, const tilemoe_peft_layer* layers, int count,
                                        const tilemoe_peft_save_options* options) {
  return guard([&] {
    require(dir != nullptr, "tilemoe_save_peft_adapter: dir is NULL");
    require(count > 0 && layers != nullptr, "tilemoe_save_peft_adapter: count must be positive and layers not NULL");
    std::vector<tilemoe::PeftSaveLayer> list;
    for (int i = 0; i < count; ++i) {
      require(layers[i].layer != nullptr, "tilemoe_save_peft_adapter: layers[" + std::to_string(i) + "].layer is NULL");
      list.push_back({&layers[i].layer->layer, layers[i].index});
    }
    tilemoe::PeftSaveOptions o;
    if (options) {
      const tilemoe_peft_dtype d = options->dtype;
      require(d == TILEMOE_PEFT_AS_HELD || d == TILEMOE_PEFT_F32 || d == TILEMOE_PEFT_BF16,
              "tilemoe_save_peft_adapter: dtype " + std::to_string(static_cast<long long>(d)) +
                  " is not TILEMOE_PEFT_AS_HELD, TILEMOE_PEFT_F32 or TILEMOE_PEFT_BF16");
      o.dtype = d == TILEMOE_PEFT_F32 ? tilemoe::PeftSaveDtype::f32 : d == TILEMOE_PEFT_BF16 ? tilemoe::PeftSaveDtype::bf16 : tilemoe::PeftSaveDtype::as_held;
      if (options->experts_module) o.experts_module = options->experts_module;
      for (int p = 0; p < 3; ++p)
        if (options->projection_names[p]) o.projection_names[static_cast<std::size_t>(p)] = options->projection_names[p];
      if (options->base_model_name_or_path) o.base_model_name_or_path = options->base_model_name_or_path;
    }
    tilemoe::save_peft_adapter(dir, list, o);
  });
}

tilemoe_status tilemoe_layer_unload_adapter(tilemoe_layer* layer) {
  return guard([&] {
    require(layer != nullptr, "tilemoe_layer_unload_adapter: layer is NULL");
    layer->layer.unload_adapter();
  });
}

tilemoe_status tilemoe_layer_cached_forwards(const tilemoe_layer* layer, int* count) {
  return guard([&] {
    require(layer && count, "tilemoe_layer_cached_forwards: layer and count must not be NULL");
    *count = layer->layer.cached_forwards();
  });
}

tilemoe_status tilemoe_layer_lora_ranks(const tilemoe_layer* layer, int ranks[3]) {
  return guard([&] {
    require(layer && ranks, "tilemoe_layer_lora_ranks: layer and ranks must not be NULL");
    for (int i = 0; i < 3; ++i) ranks[i] = layer->layer.lora().proj[static_cast<std::size_t>(i)].rank;
  });
}

tilemoe_status tilemoe_layer_copy_lora(const tilemoe_layer* layer, int projection, tilemoe_dtype dtype, void* a, void* b,
                                      float* scale, uint8_t* present) {
  return guard([&] {
    require(layer != nullptr, "tilemoe_layer_copy_lora: layer is NULL");
    require(projection >= 0 && projection < 3,
            "tilemoe_layer_copy_lora: projection " + std::to_string(projection) + " is not 0 (gate), 1 (up) or 2 (down)");
    check_dtype(dtype, "tilemoe_layer_copy_lora");
    const tilemoe::LayerPeftState st = tilemoe::layer_peft_state(layer->layer);  // after the queued tasks
    const tilemoe::LoraProjectionView& v = st.view.proj[static_cast<std::size_t>(projection)];
    const int E = st.num_experts;
    const std::size_t a_size = static_cast<std::size_t>(v.rank) * v.in, b_size = static_cast<std::size_t>(v.out) * v.rank;
    auto put = [&](void* dst, std::size_t i, float value) {
      if (dtype == TILEMOE_F32) static_cast<float*>(dst)[i] = value;
      else static_cast<uint16_t*>(dst)[i] = tilemoe::float_to_bf16(value);  // exact for bf16 values
    };
    for (int e = 0; e < E; ++e) {
      const bool active = v.active(e);
      if (present) present[e] = active ? 1 : 0;
      if (scale) scale[e] = active ? v.scale_of(e) : 0.0f;
      if (a)
        for (int j = 0; j < v.rank; ++j)
          for (int c = 0; c < v.in; ++c)
            put(a, e * a_size + static_cast<std::size_t>(j) * v.in + c,
                active ? tilemoe::factor_value(v.a_of(e), v.dtype, static_cast<std::size_t>(j) * v.lda() + c) : 0.0f);
      if (b)
        for (std::size_t i = 0; i < b_size; ++i) put(b, e * b_size + i, active ? tilemoe::factor_value(v.b_of(e), v.dtype, i) : 0.0f);
    }
  });
}

tilemoe_status tilemoe_layer_adapter_stacked_keys(const tilemoe_layer* layer, int projection, char* key_a, size_t key_a_size,
                                                 char* key_b, size_t key_b_size, int* first_row, int* b_rows) {
  return guard([&] {
    require(layer != nullptr, "tilemoe_layer_adapter_stacked_keys: layer is NULL");
    require(projection >= 0 && projection < 3,
            "tilemoe_layer_adapter_stacked_keys: projection " + std::to_string(projection) + " is not 0 (gate), 1 (up) or 2 (down)");
    const tilemoe::PeftStackedKeys k = layer->layer.adapter_stacked_keys()[static_cast<std::size_t>(projection)];
    auto fits = [](const char* name, const std::string& key, char* buf, size_t size) {
      require(!buf || key.size() < size, std::string("tilemoe_layer_adapter_stacked_keys: ") + name + "_size " + std::to_string(size) +
                                             " is too small for '" + key + "' (" + std::to_string(key.size() + 1) + " bytes with its NUL)");
    };
    fits("key_a", k.key_a, key_a, key_a_size);  // both checked before anything is written
    fits("key_b", k.key_b, key_b, key_b_size);
    if (key_a) std::memcpy(key_a, k.key_a.c_str(), k.key_a.size() + 1);
    if (key_b) std::memcpy(key_b, k.key_b.c_str(), k.key_b.size() + 1);
    if (first_row) *first_row = k.first_row;
    if (b_rows) *b_rows = k.b_rows;
  });
}

tilemoe_status tilemoe_layer_adapter_stacked_row_step(const tilemoe_layer* layer, int projection, int* row_step) {
  return guard([&] {
    require(layer != nullptr && row_step != nullptr, "tilemoe_layer_adapter_stacked_row_step: layer and row_step must not be NULL");
    require(projection >= 0 && projection < 3,
            "tilemoe_layer_adapter_stacked_row_step: projection " + std::to_string(projection) + " is not 0 (gate), 1 (up) or 2 (down)");
    *row_step = layer->layer.adapter_stacked_keys()[static_cast<std::size_t>(projection)].row_step;
  });
}

tilemoe_status tilemoe_layer_submit_forward_sft(tilemoe_layer* layer, int tokens, int top_k, const uint16_t* x,
                                                const int64_t* expert_ids, const float* weights, void* out,
                                                tilemoe_dtype out_dtype, int save_for_backward, tilemoe_ticket* ticket) {
  return guard([&] {
    require(layer && ticket, "tilemoe_layer_submit_forward_sft: layer and ticket must not be NULL");
    check_dtype(out_dtype, "tilemoe_layer_submit_forward_sft");
    *ticket = out_dtype == TILEMOE_BF16
                  ? layer->layer.submit_forward_sft(tokens, top_k, x, expert_ids, weights, static_cast<uint16_t*>(out),
                                                    save_for_backward != 0)
                  : layer->layer.submit_forward_sft(tokens, top_k, x, expert_ids, weights, static_cast<float*>(out),
                                                    save_for_backward != 0);
  });
}

tilemoe_status tilemoe_layer_submit_backward(tilemoe_layer* layer, const void* grad_output, void* grad_input, tilemoe_dtype dtype,
                                             const tilemoe_lora_grads* grads, int accumulate, tilemoe_ticket* ticket) {
  return guard([&] {
    require(layer && ticket, "tilemoe_layer_submit_backward: layer and ticket must not be NULL");
    check_dtype(dtype, "tilemoe_layer_submit_backward");
    *ticket = submit_backward(layer, grad_output, grad_input, dtype, grads_of(grads), accumulate);
  });
}

tilemoe_status tilemoe_layer_submit_backward_typed(tilemoe_layer* layer, const void* grad_output, void* grad_input, tilemoe_dtype dtype,
                                                   const tilemoe_lora_grads_typed* grads, int accumulate, tilemoe_ticket* ticket) {
  return guard([&] {
    require(layer && ticket, "tilemoe_layer_submit_backward_typed: layer and ticket must not be NULL");
    check_dtype(dtype, "tilemoe_layer_submit_backward_typed");
    *ticket = submit_backward(layer, grad_output, grad_input, dtype, typed_grads_of(grads, "tilemoe_layer_submit_backward_typed: grads"),
                              accumulate);
  });
}

}  // extern "C"

tilemoe_status tilemoe_adamw_step(tilemoe_runtime* runtime, const tilemoe_adamw_options* options, const tilemoe_adamw_segment* segments,
                                  size_t count) {
  return guard([&] {
    require(runtime != nullptr && options != nullptr, "tilemoe_adamw_step: runtime and options must not be NULL");
    require(segments != nullptr || count == 0, "tilemoe_adamw_step: segments is NULL with count > 0");
    const tilemoe::AdamWOptions o{options->lr, options->beta1, options->beta2, options->eps, options->weight_decay};
    std::vector<tilemoe::AdamWSegment> segs(count);
    for (size_t i = 0; i < count; ++i)
      segs[i] = {segments[i].param, segments[i].grad, segments[i].exp_avg, segments[i].exp_avg_sq, segments[i].count, segments[i].step};
    tilemoe::adamw_step(runtime->rt, o, segs.data(), segs.size());
  });
}
