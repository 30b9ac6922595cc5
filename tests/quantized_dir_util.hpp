#pragma once
// For the tests of quantized directories: comparing QuantizedExperts exactly, and rewriting a
// safetensors file with one thing changed (to damage a quantized directory on purpose).
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "catch.hpp"
#include "src/io/safetensors.hpp"
#include "src/io/safetensors_writer.hpp"
#include "src/quant/quantize.hpp"

namespace tilemoe::test {

// Same type, shape and group, and the same bytes of codes and scales.
inline void check_same_quantized(const quant::QuantizedExperts& got, const quant::QuantizedExperts& want) {
  CHECK(got.type == want.type);
  CHECK(got.group == want.group);
  CHECK(got.shape.hidden == want.shape.hidden);
  CHECK(got.shape.intermediate == want.shape.intermediate);
  CHECK(got.shape.num_experts == want.shape.num_experts);
  for (Projection p : kProjections) {
    INFO(projection_name(p));
    const auto &a = got[p], &b = want[p];
    CHECK(a.type == b.type);
    CHECK(a.experts == b.experts);
    CHECK(a.n == b.n);
    CHECK(a.k == b.k);
    CHECK(a.group == b.group);
    CHECK(a.codes == b.codes);
    REQUIRE(a.scales.size() == b.scales.size());
    CHECK(std::memcmp(a.scales.data(), b.scales.data(), a.scales.size() * sizeof(float)) == 0);
  }
}

// A safetensors file held in memory, to be changed and written back.
struct StoredTensor {
  std::string name;
  io::Dtype dtype;
  std::vector<std::int64_t> shape;
  std::vector<std::byte> bytes;
};
struct StoredFile {
  std::map<std::string, std::string> metadata;
  std::vector<StoredTensor> tensors;

  StoredTensor& operator[](const std::string& name) {
    auto it = std::find_if(tensors.begin(), tensors.end(), [&](const StoredTensor& t) { return t.name == name; });
    REQUIRE(it != tensors.end());
    return *it;
  }
  void erase(const std::string& name) {
    (*this)[name];
    std::erase_if(tensors, [&](const StoredTensor& t) { return t.name == name; });
  }
};

inline void rewrite_safetensors(const std::string& path, const std::function<void(StoredFile&)>& change) {
  StoredFile s;
  {
    auto f = io::SafetensorsFile::open(path);
    s.metadata = f.metadata();
    for (const auto& t : f.tensors())
      s.tensors.push_back({t.name, t.dtype, t.shape, std::vector<std::byte>(f.data(t), f.data(t) + t.nbytes)});
  }
  change(s);
  io::SafetensorsWriter w;
  for (const auto& [k, v] : s.metadata) w.set_metadata(k, v);
  for (const auto& t : s.tensors) w.add(t.name, t.dtype, t.shape, t.bytes.data());
  w.write(path);
}

}  // namespace tilemoe::test
