#pragma once
// Writes .safetensors files that the Python `safetensors` library loads: header padded with
// spaces to 8 bytes, data laid out without gaps, tensors ordered by dtype size (largest first)
// then name so that each one is aligned to its element size, as the Python library orders them.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "dtype.hpp"

namespace tilemoe::io {

class SafetensorsWriter {
 public:
  void set_metadata(std::string key, std::string value);  // a later value for a key replaces it
  // `data` holds numel * dtype_size bytes and must stay valid until write().
  void add(std::string name, Dtype dtype, std::vector<std::int64_t> shape, const void* data);
  void add_f32(std::string name, std::vector<std::int64_t> shape, std::vector<float> values);
  // The data is produced at write time straight into the output file (memory-mapped), so a
  // multi-GB tensor never needs a buffer of its own. `dst` is aligned to the dtype size.
  using Fill = std::function<void(std::byte* dst, std::size_t nbytes)>;
  void add_streamed(std::string name, Dtype dtype, std::vector<std::int64_t> shape, Fill fill);

  // Everything is checked before a file is created: duplicate names, the reserved name
  // "__metadata__", negative or overflowing shapes, an add_f32 whose value count differs from
  // its shape, a null data pointer or empty Fill throw invalid_argument. The file is written to
  // `path + ".tmp.<pid>"`, synced and renamed onto `path`, so a failure (I/O error: bad_file with
  // the path and strerror; or an exception from a Fill, rethrown) never leaves a partial output
  // nor touches an existing file at `path`.
  void write(const std::string& path) const;

 private:
  struct Entry {
    std::string name;
    Dtype dtype;
    std::vector<std::int64_t> shape;
    const void* data = nullptr;
    std::vector<float> owned;
    bool is_owned = false;
    Fill fill;
  };
  std::vector<Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace tilemoe::io
