#include "progress.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace tilemoe::io {
namespace {

std::string printf_string(const char* fmt, double a, const char* unit) {
  char buf[32];
  std::snprintf(buf, sizeof buf, fmt, a, unit);
  return buf;
}

// Decimal units, as disks and network rates are quoted.
std::string bytes_string(double b) {
  if (b >= 1e9) return printf_string("%.2f %s", b / 1e9, "GB");
  if (b >= 1e6) return printf_string("%.1f %s", b / 1e6, "MB");
  if (b >= 1e3) return printf_string("%.0f %s", b / 1e3, "kB");
  return printf_string("%.0f %s", b, "B");
}

std::string rate_string(double bytes_per_s) {
  if (bytes_per_s >= 1e9) return printf_string("%.2f %s", bytes_per_s / 1e9, "GB/s");
  if (bytes_per_s >= 1e6) return printf_string("%.0f %s", bytes_per_s / 1e6, "MB/s");
  return printf_string("%.0f %s", bytes_per_s / 1e3, "kB/s");
}

std::string duration_string(double s) {
  s = std::max(0.0, s);
  if (s < 9.95) return printf_string("%.1f %s", s, "s");
  long t = std::lround(s);
  if (t < 60) return std::to_string(t) + " s";
  if (t < 3600) return std::to_string(t / 60) + " min " + std::to_string(t % 60) + " s";
  return std::to_string(t / 3600) + " h " + std::to_string(t / 60 % 60) + " min";
}

}  // namespace

std::string format_progress_line(const std::string& label, std::size_t done, std::size_t total, double elapsed_s) {
  constexpr int kWidth = 20;
  done = std::min(done, total);
  double fraction = total > 0 ? static_cast<double>(done) / static_cast<double>(total) : 1.0;
  int filled = static_cast<int>(fraction * kWidth);
  std::string line = label + "  [" + std::string(filled, '#') + std::string(kWidth - filled, '-') + "]  ";
  line += std::to_string(static_cast<int>(fraction * 100)) + "%  ";
  line += bytes_string(static_cast<double>(done)) + " / " + bytes_string(static_cast<double>(total)) + "  ";
  bool finished = done == total;
  double rate = elapsed_s > 0 && done > 0 ? static_cast<double>(done) / elapsed_s : 0.0;
  line += rate > 0 ? rate_string(rate) : std::string("-- MB/s");
  if (finished) line += "  in " + duration_string(elapsed_s);
  else line += "  " + (rate > 0 ? duration_string(static_cast<double>(total - done) / rate) : std::string("--")) + " left";
  return line;
}

}  // namespace tilemoe::io
