#include "tools/progress_bar.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

namespace tilemoe::cli {

namespace {
constexpr std::chrono::milliseconds kRedrawInterval{100};
}

ProgressBar::ProgressBar(std::string label)
    : label_(std::move(label)), enabled_(::isatty(STDERR_FILENO) == 1), start_(std::chrono::steady_clock::now()), last_draw_(start_) {}

ProgressBar::~ProgressBar() { finish(); }

void ProgressBar::update(std::size_t done, std::size_t total) {
  done_ = done;
  total_ = total;
  if (!enabled_ || finished_) return;
  auto now = std::chrono::steady_clock::now();
  if (now - last_draw_ < kRedrawInterval) return;
  last_draw_ = now;
  draw(done, total);
}

void ProgressBar::finish() {
  if (finished_) return;
  finished_ = true;
  if (!shown_) return;
  draw(done_, total_);
  std::fputc('\n', stderr);
  std::fflush(stderr);
}

ProgressFn ProgressBar::callback() {
  return [this](std::size_t done, std::size_t total) { update(done, total); };
}

void ProgressBar::draw(std::size_t done, std::size_t total) {
  double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  std::string line = io::format_progress_line(label_, done, total, elapsed);
  // Pad over the tail of a longer previous line, which \r alone leaves on screen.
  std::size_t width = line.size();
  if (width < drawn_width_) line.append(drawn_width_ - width, ' ');
  drawn_width_ = std::max(drawn_width_, width);
  std::fprintf(stderr, "\r%s", line.c_str());
  std::fflush(stderr);
  shown_ = true;
}

}  // namespace tilemoe::cli
