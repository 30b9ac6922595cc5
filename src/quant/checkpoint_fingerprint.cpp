#include "src/quant/checkpoint_fingerprint.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string_view>
#include <vector>

#include "src/model/checkpoint.hpp"
#include "tilemoe/error.hpp"

namespace tilemoe::quant {
namespace {

class Fnv1a64 {
 public:
  void add(std::string_view s) {
    for (unsigned char c : s) h_ = (h_ ^ c) * 0x100000001b3ull;
  }
  // Length-prefixed, so that ("ab", "c") and ("a", "bc") differ.
  void field(std::string_view s) {
    add(std::to_string(s.size()));
    add(":");
    add(s);
  }
  void field(std::uint64_t v) { field(std::to_string(v)); }
  std::string hex() const {
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h_));
    return buf;
  }

 private:
  std::uint64_t h_ = 0xcbf29ce484222325ull;
};

std::string read_config_bytes(const std::string& dir) {
  const std::string path = dir + "/config.json";
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(ErrorKind::bad_file, path + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

std::string checkpoint_fingerprint(const Checkpoint& ck) {
  Fnv1a64 h;
  h.field("config.json");
  h.field(read_config_bytes(ck.dir()));
  // Shards by file name only, so that a moved or copied checkpoint keeps its hash.
  std::vector<const io::SafetensorsFile*> files;
  for (const auto& f : ck.files()) files.push_back(f.get());
  auto base = [](const io::SafetensorsFile* f) { return std::filesystem::path(f->path()).filename().string(); };
  std::sort(files.begin(), files.end(), [&](auto* a, auto* b) { return base(a) < base(b); });
  for (const auto* f : files) {
    h.field(base(f));
    for (const auto& [k, v] : f->metadata()) {
      h.field(k);
      h.field(v);
    }
    for (const auto& t : f->tensors()) {  // sorted by name
      h.field(t.name);
      h.field(io::dtype_name(t.dtype));
      h.field(t.shape.size());
      for (std::int64_t d : t.shape) h.field(static_cast<std::uint64_t>(d));
      h.field(t.offset);
      h.field(t.nbytes);
    }
  }
  return "fnv1a64:" + h.hex();
}

}  // namespace tilemoe::quant
