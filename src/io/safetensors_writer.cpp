#include "safetensors_writer.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <string_view>
#include <system_error>

#include "safetensors.hpp"
#include "tilemoe/error.hpp"

namespace tilemoe::io {
namespace {

// The Python library's Dtype enum order, used to sort data largest element first; keeping its
// exact order makes our data section byte-identical to what Python writes for the same tensors.
int python_dtype_rank(Dtype d) {
  switch (d) {
    case Dtype::U8: return 0;
    case Dtype::I8: return 1;
    case Dtype::F8_E4M3: return 2;
    case Dtype::F16: return 3;
    case Dtype::BF16: return 4;
    case Dtype::I32: return 5;
    case Dtype::F32: return 6;
    case Dtype::I64: return 7;
  }
  return 0;
}

std::string json_string(const std::string& path, const std::string& s) {
  try {
    return nlohmann::json(s).dump();
  } catch (const nlohmann::json::exception&) {
    fail(ErrorKind::invalid_argument, path + ": name or metadata is not valid UTF-8: '" + s + "'");
  }
}

// The output under its temporary name: mapped for streamed tensors, written with pwrite for the
// others, removed unless commit() succeeds.
class TmpOutput {
 public:
  explicit TmpOutput(const std::string& path)
      : path_(path), tmp_(path + ".tmp." + std::to_string(::getpid())) {}
  TmpOutput(const TmpOutput&) = delete;
  TmpOutput& operator=(const TmpOutput&) = delete;
  ~TmpOutput() {
    if (map_) ::munmap(map_, size_);
    if (fd_ >= 0) ::close(fd_);
    if (created_ && !committed_) ::unlink(tmp_.c_str());
  }

  std::byte* create(std::uint64_t size) {
    fd_ = ::open(tmp_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd_ < 0) io_error("cannot create '" + tmp_ + "'", errno);
    created_ = true;
    if (::ftruncate(fd_, static_cast<off_t>(size)) != 0) io_error("cannot resize '" + tmp_ + "'", errno);
    // Reserve the blocks now: a full disk is then an error here, not a SIGBUS while the mapping
    // is written. Filesystems without fallocate fall through to plain sparse allocation.
    int r;
    do r = ::posix_fallocate(fd_, 0, static_cast<off_t>(size));
    while (r == EINTR);
    if (r != 0 && r != EOPNOTSUPP && r != EINVAL)
      io_error("cannot allocate " + std::to_string(size) + " bytes", r);
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    if (p == MAP_FAILED) io_error("cannot mmap '" + tmp_ + "'", errno);
    map_ = p;
    size_ = size;
    return static_cast<std::byte*>(p);
  }

  // Copies bytes given in memory into the file with pwrite: no page faults, and the kernel need
  // not zero fresh page-cache pages first as it must for pages first touched through the mapping
  // (for a file of GBs, that zeroing and faulting cost more than the copy).
  void write_at(std::uint64_t offset, const void* src, std::uint64_t bytes) {
    const auto* p = static_cast<const char*>(src);
    while (bytes > 0) {
      const ssize_t w = ::pwrite(fd_, p, std::min<std::uint64_t>(bytes, 1ull << 30), static_cast<off_t>(offset));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) io_error("cannot write '" + tmp_ + "'", w < 0 ? errno : EIO);
      p += w;
      offset += static_cast<std::uint64_t>(w);
      bytes -= static_cast<std::uint64_t>(w);
    }
  }

  // Data is written front to back; once `end` bytes are written, the pages before it leave this
  // process (64 MB at a time, so small tensors cost no extra system calls). The data stays in
  // the page cache: a shared file mapping's written pages are the file's. Writing a file of many
  // GB then holds little of this process's resident memory, not the whole file until the end.
  void written_up_to(std::uint64_t end) noexcept {
    constexpr std::uint64_t kStep = 64ull << 20;
    const std::uint64_t page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
    const std::uint64_t upto = end / page * page;
    if (!map_ || upto < released_ + kStep) return;
    ::madvise(static_cast<std::byte*>(map_) + released_, upto - released_, MADV_DONTNEED);
    released_ = upto;
  }

  void commit() {
    ::munmap(map_, size_);
    map_ = nullptr;
    // Synced before the rename, so that after a crash `path` holds the old file or the new one.
    if (::fsync(fd_) != 0) io_error("cannot sync '" + tmp_ + "'", errno);
    int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) io_error("cannot close '" + tmp_ + "'", errno);
    if (::rename(tmp_.c_str(), path_.c_str()) != 0) io_error("cannot rename '" + tmp_ + "' onto it", errno);
    committed_ = true;
  }

 private:
  [[noreturn]] void io_error(const std::string& what, int err) {
    fail(ErrorKind::bad_file, path_ + ": " + what + ": " + std::system_category().message(err));
  }

  std::string path_, tmp_;
  int fd_ = -1;
  void* map_ = nullptr;
  std::uint64_t size_ = 0;
  std::uint64_t released_ = 0;
  bool created_ = false, committed_ = false;
};

}  // namespace

void SafetensorsWriter::set_metadata(std::string key, std::string value) {
  metadata_[std::move(key)] = std::move(value);
}

void SafetensorsWriter::add(std::string name, Dtype dtype, std::vector<std::int64_t> shape,
                            const void* data) {
  entries_.push_back(Entry{std::move(name), dtype, std::move(shape), data, {}, false, {}});
}

void SafetensorsWriter::add_f32(std::string name, std::vector<std::int64_t> shape,
                                std::vector<float> values) {
  entries_.push_back(
      Entry{std::move(name), Dtype::F32, std::move(shape), nullptr, std::move(values), true, {}});
}

void SafetensorsWriter::add_streamed(std::string name, Dtype dtype, std::vector<std::int64_t> shape,
                                     Fill fill) {
  entries_.push_back(Entry{std::move(name), dtype, std::move(shape), nullptr, {}, false, std::move(fill)});
}

void SafetensorsWriter::write(const std::string& path) const {
  auto invalid = [&](const Entry& e, const std::string& what) {
    fail(ErrorKind::invalid_argument, path + ": tensor '" + e.name + "' " + what);
  };
  constexpr auto kMax = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());

  std::vector<std::uint64_t> nbytes(entries_.size());
  std::set<std::string_view> names;
  for (std::size_t i = 0; i < entries_.size(); ++i) {
    const Entry& e = entries_[i];
    if (e.name == "__metadata__") invalid(e, "uses the name reserved for the file's metadata");
    if (!names.insert(e.name).second) invalid(e, "is added twice");
    std::uint64_t numel = 1;
    bool overflow = false;
    for (std::int64_t d : e.shape) {
      if (d < 0) invalid(e, "has a negative dimension in shape " + shape_string(e.shape));
      overflow = overflow || __builtin_mul_overflow(numel, static_cast<std::uint64_t>(d), &numel);
    }
    if (overflow || numel > kMax || __builtin_mul_overflow(numel, dtype_size(e.dtype), &nbytes[i]) ||
        nbytes[i] > kMax)
      invalid(e, "has shape " + shape_string(e.shape) + ", too large");
    if (e.is_owned && e.owned.size() != numel)
      invalid(e, "has shape " + shape_string(e.shape) + " (" + std::to_string(numel) + " values) but " +
                     std::to_string(e.owned.size()) + " values were given");
    if (!e.is_owned && !e.fill && !e.data && nbytes[i] > 0) invalid(e, "has no data");
  }

  std::vector<std::size_t> by_layout(entries_.size());
  for (std::size_t i = 0; i < by_layout.size(); ++i) by_layout[i] = i;
  auto by_name = by_layout;
  std::sort(by_layout.begin(), by_layout.end(), [&](std::size_t a, std::size_t b) {
    int ra = python_dtype_rank(entries_[a].dtype), rb = python_dtype_rank(entries_[b].dtype);
    return ra != rb ? ra > rb : entries_[a].name < entries_[b].name;
  });
  std::sort(by_name.begin(), by_name.end(),
            [&](std::size_t a, std::size_t b) { return entries_[a].name < entries_[b].name; });
  std::vector<std::uint64_t> begin(entries_.size());
  std::uint64_t data_size = 0;
  for (std::size_t i : by_layout) {
    begin[i] = data_size;
    if (__builtin_add_overflow(data_size, nbytes[i], &data_size) || data_size > kMax)
      fail(ErrorKind::invalid_argument, path + ": total data size overflows");
  }

  // Field order within an entry as the Python library writes it; metadata first, as it does.
  std::string header = "{";
  auto sep = [&] {
    if (header.back() != '{') header += ',';
  };
  if (!metadata_.empty()) {
    header += "\"__metadata__\":{";
    for (const auto& [k, v] : metadata_) {
      sep();
      header += json_string(path, k);
      header += ':';
      header += json_string(path, v);
    }
    header += '}';
  }
  for (std::size_t i : by_name) {
    const Entry& e = entries_[i];
    sep();
    header += json_string(path, e.name);
    header += ":{\"dtype\":\"";
    header += dtype_name(e.dtype);
    header += "\",\"shape\":[";
    for (std::size_t d = 0; d < e.shape.size(); ++d) {
      if (d) header += ',';
      header += std::to_string(e.shape[d]);
    }
    header += "],\"data_offsets\":[";
    header += std::to_string(begin[i]);
    header += ',';
    header += std::to_string(begin[i] + nbytes[i]);
    header += "]}";
  }
  header += "}";
  header.append((8 - header.size() % 8) % 8, ' ');
  const std::uint64_t data_start = 8 + header.size();
  if (data_size > kMax - data_start) fail(ErrorKind::invalid_argument, path + ": total size overflows");

  TmpOutput out(path);
  std::byte* dst = out.create(data_start + data_size);
  const std::uint64_t n = header.size();
  std::memcpy(dst, &n, 8);
  std::memcpy(dst + 8, header.data(), header.size());
  for (std::size_t i : by_layout) {
    const Entry& e = entries_[i];
    std::byte* p = dst + data_start + begin[i];
    if (e.fill) {
      e.fill(p, nbytes[i]);
    } else if (nbytes[i] > 0) {
      out.write_at(data_start + begin[i], e.is_owned ? static_cast<const void*>(e.owned.data()) : e.data, nbytes[i]);
    }
    out.written_up_to(data_start + begin[i] + nbytes[i]);
  }
  out.commit();
}

}  // namespace tilemoe::io
