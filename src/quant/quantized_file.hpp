#pragma once
// A directory of quantized routed experts, as `tilemoe quantize` writes it and the runtime loads
// it without quantizing again:
//
//   quantization.json     the index (below); written last, so a directory without it is an
//                         interrupted run and is refused
//   config.json           the source checkpoint's, byte for byte
//   router.safetensors    each quantized layer's router weight (and correction bias) under the
//                         source's names and dtypes; absent when the source has no routers
//   layer_L.safetensors   layer L's experts; with N NUMA nodes, layer_L.node_n.safetensors for
//                         n < N instead, each holding node n's slice (src/quant/numa_slices.hpp)
//
// For each expert projection the source stores as "<base>.weight" (the source's own naming:
// "model.layers.3.mlp.experts.7.gate_proj", Mixtral's "...block_sparse_moe.experts.7.w1"), a
// layer file holds, with n x k that projection's shape within the file's slice:
//   <base>.qweight  int8: I8 [n, k], codes -127..127
//                   int4: U8 [n, (k + 1) / 2], two codes a byte, the even input in the low
//                         nibble, two's complement (-8..7); an odd k leaves a zero high nibble
//                   mxfp4: U8 [n, (k + 1) / 2], E2M1 codes laid out as int4's
//   <base>.scales   F32, finite and >= 0: int8 [n], one per output row (a node's down slice
//                   keeps its whole row's scale); int4 [n, ceil(k / group)]; mxfp4 [n, ceil(k / 32)],
//                   each a power of two in [2^-125, 2^125]
// and nothing else: the codes and scales of QuantizedExperts (src/quant/quantize.hpp) as they
// are in memory. The file's safetensors __metadata__ repeats format, format_version,
// weight_type, group_size, layer, node, numa_nodes, slice_begin, slice_end, hidden,
// intermediate, num_experts and source_hash, so a file from another run or layer is caught.
//
// quantization.json:
//   {"format": "tilemoe.quantized_experts", "format_version": 1,
//    "weight_type": "int8" | "int4" | "mxfp4", "group_size": 0 (int8) | 32 | 64 | 128 (int4) | 32 (mxfp4),
//    "model_type": "deepseek_v2", "shape": {"hidden", "intermediate", "num_experts", "top_k"},
//    "layers": [1, 2, ...], "numa_nodes": N, "slices": [[begin, end], ...] (intermediate ranges),
//    "files": {"1": ["layer_1.safetensors"], ...}, "router": {"file": "router.safetensors", "layers": [...]},
//    "tensor_names": {"gate": "model.layers.{L}.mlp.experts.{E}.gate_proj", "up": ..., "down": ...},
//    "source": {"hash": "fnv1a64:...", "hash_covers": "..."}}   (src/quant/checkpoint_fingerprint.hpp)
#include <array>
#include <map>
#include <string>
#include <vector>

#include "src/quant/numa_slices.hpp"
#include "src/quant/quantize.hpp"

namespace tilemoe {
class Checkpoint;
}

namespace tilemoe::quant {

inline constexpr const char* kQuantizedFormat = "tilemoe.quantized_experts";
inline constexpr int kQuantizedFormatVersion = 1;
inline constexpr const char* kQuantizedIndexFile = "quantization.json";

// What quantization.json says.
struct QuantizedModelInfo {
  WeightType type = WeightType::int8;
  int group = 0;  // int4 group size; 32 for mxfp4; 0 for int8
  std::string model_type;
  MoeShape shape;
  std::vector<int> layers;                        // ascending
  std::vector<IntermediateSlice> slices;          // one per NUMA node; one [0, intermediate) when unsplit
  std::map<int, std::vector<std::string>> files;  // layer -> file name per node
  std::array<std::string, 3> name_templates;      // per projection, with {L} and {E}
  std::string source_hash;
  std::string router_file;                        // empty when no router was copied
  std::vector<int> router_layers;

  int numa_nodes() const { return static_cast<int>(slices.size()); }
};

// The stored weight name of (layer, expert) as a template: "model.layers.3.mlp.experts.7.w1.weight"
// -> "model.layers.{L}.mlp.experts.{E}.w1". Throws unsupported when the name has no
// "layers.<layer>" followed by "experts.<expert>".
std::string expert_name_template(const std::string& weight_name, int layer, int expert);
// The same for an expert of a tensor that stacks a layer's experts (transformers v5):
// "model.layers.3.mlp.experts.gate_up_proj" -> "model.layers.{L}.mlp.experts.{E}.gate_proj" for
// gate and "...{E}.up_proj" for up.
std::string stacked_expert_name_template(const std::string& stacked_name, int layer, Projection p);
// The template filled in: the name a projection's .qweight and .scales share.
std::string expert_tensor_base(const std::string& name_template, int layer, int expert);

// Reads and checks quantization.json (not the layer files). Throws bad_file naming the file and
// field: missing or malformed fields, another format, a format_version this build does not read.
QuantizedModelInfo read_quantized_info(const std::string& dir);

// Layer `layer`'s experts, every node's slice reassembled: the codes and scales that were written.
// Checks quantization.json against `expected` (hidden, intermediate and expert count; top-k
// too when both give one) and, when `source_hash` is not empty, against the checkpoint the
// caller runs (checkpoint_fingerprint); then every file's metadata, every tensor's presence,
// dtype and shape, int8 codes (-128 is refused), int4 and mxfp4 padding, and scales (finite, >= 0; mxfp4's powers of two in range). The
// first problem found is a tilemoe::Error naming the file and the tensor or field: invalid_argument
// for a directory that does not fit the model, bad_file for a damaged or inconsistent one. The
// experts' swiglu_limit is `expected`'s (an activation, which the files do not store).
QuantizedExperts load_quantized_layer(const std::string& dir, int layer, const MoeShape& expected,
                                      const std::string& source_hash = {});
// Node `node`'s slice only (slice_experts' form: intermediate = the slice's width), reading only
// that node's file; the same checks.
QuantizedExperts load_quantized_layer_slice(const std::string& dir, int layer, int node, const MoeShape& expected,
                                            const std::string& source_hash = {});

// What a writer needs to know before the first layer.
struct QuantizedModelSpec {
  WeightType type = WeightType::int8;
  int group = 0;  // int4: 32, 64 or 128; mxfp4: 32; ignored for int8
  int numa_nodes = 1;
  std::vector<int> layers;  // those that will be written, ascending
  MoeShape shape;
  std::string model_type;
  std::array<std::string, 3> name_templates;  // see expert_name_template
  std::string source_hash;
  std::string config_json;  // written as config.json
};

// The spec for quantizing `layers` of `ck`: its config.json, shape, fingerprint and naming. Throws
// unsupported when some layer's experts are not named as the first layer's are, and
// invalid_argument for a bad type, group, node count (see numa_slices) or layer list.
QuantizedModelSpec spec_for_checkpoint(const Checkpoint& ck, WeightType type, int group, int numa_nodes,
                                       std::vector<int> layers);

// Writes a quantized directory one layer at a time, so that memory holds one layer at most.
class QuantizedModelWriter {
 public:
  // Checks the spec, creates `dir` (which must not exist or be an empty directory) and writes
  // config.json.
  QuantizedModelWriter(std::string dir, QuantizedModelSpec spec);
  // Unless commit() succeeded, removes every file it wrote, and `dir` if it created it: a failed
  // run leaves nothing that looks like a result.
  ~QuantizedModelWriter();
  QuantizedModelWriter(const QuantizedModelWriter&) = delete;
  QuantizedModelWriter& operator=(const QuantizedModelWriter&) = delete;

  // Copies each layer's router into router.safetensors; returns one warning per layer without a
  // router (the quantized experts do not need one; routing from this directory then cannot).
  std::vector<std::string> copy_routers(const Checkpoint& source);
  // Writes the layer's file (one per node) now. `q` must have the spec's type, group and shape,
  // and the layer must be in the spec and not written yet. Returns the bytes written.
  std::size_t write_layer(int layer, const QuantizedExperts& q);
  // Writes quantization.json; throws state unless every layer of the spec was written.
  void commit();

  const std::string& dir() const { return dir_; }

 private:
  void write_text(const std::string& name, const std::string& text);
  void remove_written() noexcept;

  std::string dir_;
  std::string config_json_;
  QuantizedModelInfo info_;
  bool created_dir_ = false;
  bool committed_ = false;
  std::vector<std::string> written_;  // paths, for the cleanup
};

}  // namespace tilemoe::quant
