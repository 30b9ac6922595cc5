#include "safetensors.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <set>
#include <system_error>
#include <utility>

#include "tilemoe/error.hpp"

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian");

namespace tilemoe::io {
namespace {

using json = nlohmann::json;

// The Python library's limit: a larger header is an attack or a corrupt length, not a model.
constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;
// A valid header nests three levels deep; nlohmann builds deep documents iteratively, but a
// bound keeps a hostile header from costing memory per level.
constexpr int kMaxJsonDepth = 16;
constexpr std::size_t kMaxQuoted = 200;

// Keys and values come from the file: keep error messages one line and bounded.
std::string quote_key(std::string_view s) {
  std::string out = "'";
  for (std::size_t i = 0; i < s.size() && i < kMaxQuoted; ++i) {
    auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f) {
      static constexpr char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  if (s.size() > kMaxQuoted) out += "...";
  return out + "'";
}

std::string errno_text(int err) { return std::system_category().message(err); }

[[noreturn]] void bad(const std::string& path, const std::string& what) {
  fail(ErrorKind::bad_file, path + ": " + what);
}
[[noreturn]] void bad(const std::string& path, const std::string& what, std::string_view key) {
  fail(ErrorKind::bad_file, path + ": " + what + " (tensor " + quote_key(key) + ")");
}

std::string describe(const json& v) {
  if (v.is_number_integer() || v.is_number_float() || v.is_boolean() || v.is_null()) return v.dump();
  return std::string("a JSON ") + v.type_name();
}

std::optional<std::uint64_t> as_u64(const json& v) {
  if (v.is_number_unsigned()) return v.get<std::uint64_t>();
  if (v.is_number_integer()) {
    auto i = v.get<std::int64_t>();
    if (i >= 0) return static_cast<std::uint64_t>(i);
  }
  return std::nullopt;
}

// Refuses duplicate keys and deep nesting in one linear SAX pass: a second "w" entry would
// silently replace the first, and which one a file "means" is then anyone's guess. (nlohmann's
// callback parser could do this, but it rescans the parent object after every child object,
// which is quadratic: minutes for the ~90k entries of a large adapter.)
[[noreturn]] void bad_json(const std::string& path, const std::exception& e) {
  std::string what = e.what();
  if (what.size() > 300) what = what.substr(0, 300) + "...";
  bad(path, "header is not valid JSON: " + what);
}

struct HeaderShapeCheck {
  const std::string& path;
  std::vector<std::set<std::string>> keys;
  int depth = 0;

  bool enter() {
    if (++depth > kMaxJsonDepth) bad(path, "header nests deeper than " + std::to_string(kMaxJsonDepth) + " levels");
    return true;
  }
  bool null() { return true; }
  bool boolean(bool) { return true; }
  bool number_integer(json::number_integer_t) { return true; }
  bool number_unsigned(json::number_unsigned_t) { return true; }
  bool number_float(json::number_float_t, const std::string&) { return true; }
  bool string(std::string&) { return true; }
  bool binary(json::binary_t&) { return true; }
  bool start_object(std::size_t) {
    keys.emplace_back();
    return enter();
  }
  bool key(std::string& k) {
    if (!keys.back().insert(k).second) bad(path, "header has duplicate key " + quote_key(k));
    return true;
  }
  bool end_object() {
    keys.pop_back();
    --depth;
    return true;
  }
  bool start_array(std::size_t) { return enter(); }
  bool end_array() {
    --depth;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) { bad_json(path, e); }
};

json parse_header(const std::string& path, const char* begin, const char* end) {
  HeaderShapeCheck check{path, {}, 0};
  json::sax_parse(begin, end, &check);
  try {
    return json::parse(begin, end);
  } catch (const json::exception& e) {
    bad_json(path, e);
  }
}

// Checks one tensor entry; `offset` is left relative to the data section.
TensorInfo parse_tensor(const std::string& path, const std::string& key, const json& v,
                        std::uint64_t data_size) {
  if (!v.is_object()) bad(path, "entry is " + describe(v) + ", not an object", key);
  for (const char* field : {"dtype", "shape", "data_offsets"})
    if (!v.contains(field)) bad(path, std::string("entry has no '") + field + "'", key);

  TensorInfo t;
  t.name = key;
  const json& dt = v["dtype"];
  if (!dt.is_string()) bad(path, "dtype is " + describe(dt) + ", not a string", key);
  auto dtype = parse_dtype(dt.get_ref<const std::string&>());
  if (!dtype)
    bad(path,
        "unknown or unsupported dtype " + quote_key(dt.get_ref<const std::string&>()) +
            " (supported: BF16, F16, F32, F8_E4M3, I8, U8, I32, I64)",
        key);
  t.dtype = *dtype;

  const json& shape = v["shape"];
  if (!shape.is_array()) bad(path, "shape is " + describe(shape) + ", not an array", key);
  std::uint64_t numel = 1;
  bool overflow = false;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    auto dim = as_u64(shape[i]);
    if (!dim || *dim > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
      bad(path,
          "shape entry " + std::to_string(i) + " is " + describe(shape[i]) + ", not a non-negative integer",
          key);
    t.shape.push_back(static_cast<std::int64_t>(*dim));
    overflow = overflow || __builtin_mul_overflow(numel, *dim, &numel);
  }
  std::uint64_t nbytes = 0;
  if (overflow || numel > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) ||
      __builtin_mul_overflow(numel, dtype_size(t.dtype), &nbytes))
    bad(path, "shape " + shape_string(t.shape) + " overflows a 64-bit byte count", key);

  const json& offs = v["data_offsets"];
  std::optional<std::uint64_t> begin, end;
  if (offs.is_array() && offs.size() == 2) {
    begin = as_u64(offs[0]);
    end = as_u64(offs[1]);
  }
  if (!begin || !end) bad(path, "data_offsets is not two non-negative integers", key);
  std::string range = "data_offsets [" + std::to_string(*begin) + ", " + std::to_string(*end) + "]";
  if (*begin > *end) bad(path, range + " begin after end", key);
  if (*end - *begin != nbytes)
    bad(path,
        range + " hold " + std::to_string(*end - *begin) + " bytes but " + dtype_name(t.dtype) + " " +
            shape_string(t.shape) + " needs " + std::to_string(nbytes),
        key);
  if (*end > data_size)
    bad(path, range + " run past the data section (" + std::to_string(data_size) + " bytes; truncated file?)",
        key);
  t.offset = static_cast<std::size_t>(*begin);
  t.nbytes = static_cast<std::size_t>(nbytes);
  return t;
}

// Data ranges may leave gaps (the Python library would refuse those; they harm no one), but no
// byte may belong to two tensors. Zero-byte tensors cover nothing.
void check_overlaps(const std::string& path, const std::vector<TensorInfo>& tensors) {
  std::vector<const TensorInfo*> order;
  for (const auto& t : tensors)
    if (t.nbytes > 0) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return std::pair(a->offset, a->nbytes) < std::pair(b->offset, b->nbytes);
  });
  const TensorInfo* reach = nullptr;  // the tensor ending furthest so far
  for (const TensorInfo* t : order) {
    if (reach && t->offset < reach->offset + reach->nbytes)
      bad(path, "data overlaps that of tensor " + quote_key(reach->name), t->name);
    if (!reach || t->offset + t->nbytes > reach->offset + reach->nbytes) reach = t;
  }
}

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

}  // namespace

std::int64_t TensorInfo::numel() const {
  return std::accumulate(shape.begin(), shape.end(), std::int64_t{1}, std::multiplies<>());
}

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  // O_NONBLOCK: a FIFO would otherwise block open until a writer appears; fstat refuses it.
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (fd.get() < 0) bad(path, "cannot open: " + errno_text(errno));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) bad(path, "cannot stat: " + errno_text(errno));
  if (S_ISDIR(st.st_mode)) bad(path, "is a directory, not a safetensors file");
  if (!S_ISREG(st.st_mode)) bad(path, "is not a regular file");
  const auto file_size = static_cast<std::uint64_t>(st.st_size);
  if (file_size == 0) bad(path, "file is empty");
  if (file_size < 8)
    bad(path, "file is " + std::to_string(file_size) + " bytes, too short for the 8-byte header length");

  SafetensorsFile f;
  f.path_ = path;
  void* p = ::mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd.get(), 0);
  if (p == MAP_FAILED) bad(path, "cannot mmap: " + errno_text(errno));
  f.base_ = static_cast<const std::byte*>(p);
  f.size_ = file_size;

  std::uint64_t n;
  std::memcpy(&n, f.base_, 8);
  if (n == 0) bad(path, "header length is 0");
  if (n > kMaxHeaderBytes)
    bad(path,
        "header length " + std::to_string(n) + " exceeds the limit of " + std::to_string(kMaxHeaderBytes));
  if (n > file_size - 8)
    bad(path, "header length " + std::to_string(n) + " runs past the end of the file (" +
                  std::to_string(file_size) + " bytes)");
  const auto* text = reinterpret_cast<const char*>(f.base_ + 8);
  // nlohmann stops at a NUL as at the end of input, so "{}\0<anything>" would pass. Valid JSON
  // never holds a raw NUL.
  if (std::memchr(text, 0, n) != nullptr) bad(path, "header is not valid JSON: it contains a NUL byte");
  json header = parse_header(path, text, text + n);
  if (!header.is_object()) bad(path, "header is " + describe(header) + ", not a JSON object");

  const std::uint64_t data_start = 8 + n;
  for (auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) bad(path, "__metadata__ is " + describe(value) + ", not an object");
      for (auto& [mk, mv] : value.items()) {
        if (!mv.is_string())
          bad(path, "__metadata__ value for " + quote_key(mk) + " is " + describe(mv) + ", not a string");
        f.metadata_.emplace(mk, mv.get<std::string>());
      }
      continue;
    }
    f.tensors_.push_back(parse_tensor(path, key, value, file_size - data_start));
  }
  check_overlaps(path, f.tensors_);
  for (auto& t : f.tensors_) t.offset += data_start;
  // json objects iterate in key order, so tensors_ is already sorted; keep it robust anyway.
  std::sort(f.tensors_.begin(), f.tensors_.end(),
            [](const TensorInfo& a, const TensorInfo& b) { return a.name < b.name; });
  return f;
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& other) noexcept
    : path_(std::move(other.path_)),
      base_(std::exchange(other.base_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      tensors_(std::move(other.tensors_)),
      metadata_(std::move(other.metadata_)) {}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& other) noexcept {
  if (this != &other) {
    unmap();
    path_ = std::move(other.path_);
    base_ = std::exchange(other.base_, nullptr);
    size_ = std::exchange(other.size_, 0);
    tensors_ = std::move(other.tensors_);
    metadata_ = std::move(other.metadata_);
  }
  return *this;
}

SafetensorsFile::~SafetensorsFile() { unmap(); }

void SafetensorsFile::unmap() noexcept {
  if (base_) ::munmap(const_cast<std::byte*>(base_), size_);
  base_ = nullptr;
  size_ = 0;
}

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
  auto it = std::lower_bound(tensors_.begin(), tensors_.end(), name,
                             [](const TensorInfo& t, std::string_view n) { return t.name < n; });
  return it != tensors_.end() && it->name == name ? &*it : nullptr;
}

void SafetensorsFile::prefetch(std::size_t offset, std::size_t bytes) const noexcept {
  if (!base_ || offset >= size_) return;
  bytes = std::min(bytes, size_ - offset);
  const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  std::size_t begin = offset / page * page;
  ::madvise(const_cast<std::byte*>(base_) + begin, offset + bytes - begin, MADV_WILLNEED);
}

void SafetensorsFile::release(std::size_t offset, std::size_t bytes) const noexcept {
  if (!base_ || offset >= size_) return;
  bytes = std::min(bytes, size_ - offset);
  const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  // Whole pages only, rounded outwards: a page shared with a neighbouring tensor is dropped too,
  // which is harmless on this read-only private mapping (it is read back from the file).
  std::size_t begin = offset / page * page;
  std::size_t end = std::min(size_, (offset + bytes + page - 1) / page * page);
  ::madvise(const_cast<std::byte*>(base_) + begin, end - begin, MADV_DONTNEED);
}

const TensorInfo& SafetensorsFile::get(std::string_view name) const {
  if (const TensorInfo* t = find(name)) return *t;
  bad(path_, "no tensor " + quote_key(name));
}

const std::byte* SafetensorsFile::data(const TensorInfo& t) const {
  // A TensorInfo of another (larger) file would read out of bounds.
  if (!base_ || t.offset > size_ || t.nbytes > size_ - t.offset)
    fail(ErrorKind::invalid_argument, path_ + ": tensor " + quote_key(t.name) + " is not in this file");
  return base_ + t.offset;
}

}  // namespace tilemoe::io
