// libFuzzer target over every file tilemoe reads: the first input byte picks the file, the rest is
// its contents; the other files of the directory are the tiny fixture's own (tests/data), so a
// mutation reaches the checks past the parser. A loader may refuse an input only by throwing
// tilemoe::Error; any other exception, crash, leak or undefined behaviour is a finding.
// Built and run by scripts/fuzz.sh (clang, -fsanitize=fuzzer,address,undefined), from the repository's root.
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "src/io/safetensors.hpp"
#include "src/lora/lora_file.hpp"
#include "src/lora/peft_adapter.hpp"
#include "src/model/checkpoint.hpp"
#include "src/model/model_config.hpp"
#include "src/quant/mxfp4_checkpoint.hpp"
#include "src/quant/quantize.hpp"
#include "src/quant/quantized_file.hpp"
#include "tilemoe/error.hpp"

namespace fs = std::filesystem;
using namespace tilemoe;

namespace {

// What each selector feeds (the first byte modulo kTargets).
enum Target {
  safetensors, model_config, peft_config, peft_tensors, converted_lora, checkpoint, quantization_json, quantized_layer,
  quantization_json_mxfp4, quantized_layer_mxfp4, kTargets
};

struct Dirs {
  std::string fixture;    // tests/data/<case>: model/ and adapter/
  std::string work;       // per process
  std::string model, adapter, quantized, quantized_mxfp4;  // int8 and mxfp4 directories
  ModelConfig config;
  int layer = 0;          // the fixture's first MoE layer
  ~Dirs() {
    std::error_code ignored;
    fs::remove_all(work, ignored);
  }
};

Dirs& dirs() {
  static Dirs d = [] {
    Dirs d;
    const char* fixture = std::getenv("TILEMOE_FUZZ_FIXTURE");
    d.fixture = fixture ? fixture : "tests/data/original_moe_tiny";
    d.work = (fs::temp_directory_path() / ("tilemoe-fuzz." + std::to_string(getpid()))).string();
    d.model = d.work + "/model";
    d.adapter = d.work + "/adapter";
    d.quantized = d.work + "/quantized";
    d.quantized_mxfp4 = d.work + "/quantized_mxfp4";
    fs::remove_all(d.work);
    fs::create_directories(d.work);
    fs::copy(d.fixture + "/model", d.model, fs::copy_options::recursive);
    fs::copy(d.fixture + "/adapter", d.adapter, fs::copy_options::recursive);
    const Checkpoint ck = Checkpoint::open(d.model);
    d.config = ck.config();
    d.layer = d.config.moe_layers.at(0);
    quant::QuantizedModelWriter writer(d.quantized, quant::spec_for_checkpoint(ck, WeightType::int8, 0, 1, {d.layer}));
    writer.write_layer(d.layer, quant::quantize_experts(ck.load_layer_experts(d.layer).view(), WeightType::int8, 0, nullptr));
    writer.commit();
    quant::QuantizedModelWriter mx(d.quantized_mxfp4, quant::spec_for_checkpoint(ck, WeightType::mxfp4, 0, 1, {d.layer}));
    mx.write_layer(d.layer, quant::quantize_experts(ck.load_layer_experts(d.layer).view(), WeightType::mxfp4, 0, nullptr));
    mx.commit();
    return d;
  }();
  return d;
}

// Replaces `path` for one input and puts the original back afterwards.
class Swap {
 public:
  Swap(std::string path, const std::uint8_t* data, std::size_t size) : path_(std::move(path)) {
    std::ifstream in(path_, std::ios::binary);
    saved_.assign(std::istreambuf_iterator<char>(in), {});
    write(reinterpret_cast<const char*>(data), size);
  }
  ~Swap() { write(saved_.data(), saved_.size()); }

 private:
  void write(const char* p, std::size_t n) { std::ofstream(path_, std::ios::binary | std::ios::trunc).write(p, static_cast<std::streamsize>(n)); }
  std::string path_, saved_;
};

std::string only_file_with(const std::string& dir, const std::string& ext) {
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ext) return e.path().string();
  return {};
}

void run(Target t, const std::uint8_t* data, std::size_t size) {
  Dirs& d = dirs();
  switch (t) {
    case safetensors: {
      Swap s(d.work + "/x.safetensors", data, size);
      const io::SafetensorsFile f = io::SafetensorsFile::open(d.work + "/x.safetensors");
      for (const io::TensorInfo& ti : f.tensors()) {
        try { (void)io::read_as_f32(f, ti.name); } catch (const Error&) {}
        try { (void)io::read_as_bf16(f, ti.name); } catch (const Error&) {}
        try { (void)io::read_as_i64(f, ti.name); } catch (const Error&) {}
      }
      return;
    }
    case model_config: (void)parse_model_config(std::string(reinterpret_cast<const char*>(data), size), "config.json"); return;
    case peft_config: {
      Swap s(d.adapter + "/adapter_config.json", data, size);
      (void)read_peft_config(d.adapter);
      return;
    }
    case peft_tensors: {
      Swap s(d.adapter + "/adapter_model.safetensors", data, size);
      const PeftAdapter a = PeftAdapter::open(d.adapter, d.config);
      for (int l : a.layers()) (void)load_peft_layer(a, d.config.shape, l);
      return;
    }
    case converted_lora: {
      Swap s(d.work + "/lora.safetensors", data, size);
      for (int l : d.config.moe_layers) {
        try { (void)load_converted_layer(d.work + "/lora.safetensors", d.config, l); } catch (const Error&) {}
      }
      return;
    }
    case checkpoint: {
      Swap s(only_file_with(d.model, ".safetensors"), data, size);
      const Checkpoint ck = Checkpoint::open(d.model);
      for (int l : ck.config().moe_layers) {
        try { (void)ck.load_layer_experts(l); } catch (const Error&) {}
        try {
          quant::QuantizedExperts q;  // MXFP4 layers (the gpt_oss fixture) taken as stored
          (void)quant::read_mxfp4_layer(ck, l, q);
        } catch (const Error&) {}
        try { (void)ck.load_router(l); } catch (const Error&) {}
      }
      return;
    }
    case quantization_json: {
      Swap s(d.quantized + "/quantization.json", data, size);
      (void)quant::load_quantized_layer(d.quantized, d.layer, d.config.shape);
      return;
    }
    case quantized_layer: {
      Swap s(d.quantized + "/layer_" + std::to_string(d.layer) + ".safetensors", data, size);
      (void)quant::load_quantized_layer(d.quantized, d.layer, d.config.shape);
      return;
    }
    case quantization_json_mxfp4: {
      Swap s(d.quantized_mxfp4 + "/quantization.json", data, size);
      (void)quant::load_quantized_layer(d.quantized_mxfp4, d.layer, d.config.shape);
      return;
    }
    case quantized_layer_mxfp4: {
      Swap s(d.quantized_mxfp4 + "/layer_" + std::to_string(d.layer) + ".safetensors", data, size);
      (void)quant::load_quantized_layer(d.quantized_mxfp4, d.layer, d.config.shape);
      return;
    }
    case kTargets: return;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  try {
    run(static_cast<Target>(data[0] % kTargets), data + 1, size - 1);
  } catch (const Error&) {
  }
  return 0;
}
