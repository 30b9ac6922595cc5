#pragma once
// Read-only access to one .safetensors file. The file is memory-mapped and its header checked in
// full at open, so that every TensorInfo afterwards describes bytes that exist in the file: a
// hostile or truncated file fails at open with ErrorKind::bad_file, never later.
#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dtype.hpp"
#include "tilemoe/bf16.hpp"

namespace tilemoe::io {

struct TensorInfo {
  std::string name;
  Dtype dtype;
  std::vector<std::int64_t> shape;
  std::size_t offset;  // absolute in the file
  std::size_t nbytes;
  std::int64_t numel() const;
};

class SafetensorsFile {
 public:
  // Throws tilemoe::Error(ErrorKind::bad_file, "<path>: <what is wrong>[ (tensor '<key>')]").
  static SafetensorsFile open(const std::string& path);

  SafetensorsFile(SafetensorsFile&& other) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& other) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();

  const std::string& path() const { return path_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }  // sorted by name
  const TensorInfo* find(std::string_view name) const;                 // nullptr if absent
  const TensorInfo& get(std::string_view name) const;  // throws bad_file "<path>: no tensor '<name>'"
  // Start of the tensor's bytes in the mapping; not aligned in general (the header length is
  // the file's choice), so read through memcpy or the convert_* functions.
  const std::byte* data(const TensorInfo& t) const;
  // Asks the kernel to read [offset, offset + bytes) of the file ahead, in one sequential sweep:
  // for gathers that touch many small tensors of one region, which would otherwise fault them in
  // one scattered read at a time. Out-of-range parts are ignored; only a hint.
  void prefetch(std::size_t offset, std::size_t bytes) const noexcept;
  // Drops the pages of [offset, offset + bytes) from this process's memory (the kernel's page
  // cache keeps them): for readers that copy a tensor out and will not look at it again, so
  // that reading a whole checkpoint layer by layer does not grow the resident set by the size
  // of the checkpoint. Reading the range again afterwards is still valid (it faults back in).
  void release(std::size_t offset, std::size_t bytes) const noexcept;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  SafetensorsFile() = default;
  void unmap() noexcept;

  std::string path_;
  const std::byte* base_ = nullptr;
  std::size_t size_ = 0;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// Typed reads with conversion and shape check. An empty `expected_shape` skips the check; a
// mismatch throws ErrorKind::invalid_argument
// "<path>: tensor '<name>' has shape [a, b], expected [c, d]".
std::vector<float> read_as_f32(const SafetensorsFile& f, std::string_view name,
                               std::span<const std::int64_t> expected_shape = {});
// BF16 is copied as is; F32, F16 and F8_E4M3 are rounded to nearest even. Integer tensors are
// refused (invalid_argument): reading indices as bf16 is a bug, not a conversion.
std::vector<bf16> read_as_bf16(const SafetensorsFile& f, std::string_view name,
                               std::span<const std::int64_t> expected_shape = {});
// I64, I32, I8 and U8 only; any other dtype throws invalid_argument naming it.
std::vector<std::int64_t> read_as_i64(const SafetensorsFile& f, std::string_view name,
                                      std::span<const std::int64_t> expected_shape = {});

// `data` needs no alignment. convert_to_bf16 throws invalid_argument for integer dtypes.
void convert_to_f32(Dtype src, const std::byte* data, std::size_t count, float* out);
void convert_to_bf16(Dtype src, const std::byte* data, std::size_t count, bf16* out);

std::string shape_string(std::span<const std::int64_t> shape);  // "[2, 3]"

}  // namespace tilemoe::io
