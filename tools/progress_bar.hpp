#pragma once
// A one-line progress bar on stderr for long loads and conversions, redrawn in place at most ten
// times a second. Only a terminal sees it: with stderr redirected (scripts, tests, logs) it writes
// nothing, so the output there stays one line per message.
#include <chrono>
#include <cstddef>
#include <string>

#include "src/io/progress.hpp"

namespace tilemoe::cli {

class ProgressBar {
 public:
  explicit ProgressBar(std::string label);
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;
  ~ProgressBar();  // finish()es, so an error message that follows starts on a line of its own

  void update(std::size_t done, std::size_t total);
  // Draws the last state reported and ends the line; nothing if the bar never showed (a job quicker
  // than one redraw interval leaves no trace).
  void finish();
  // A callback for the library's ProgressFn parameters; valid while this bar lives.
  ProgressFn callback();

 private:
  void draw(std::size_t done, std::size_t total);

  std::string label_;
  bool enabled_;
  bool shown_ = false;
  bool finished_ = false;
  std::size_t done_ = 0, total_ = 0, drawn_width_ = 0;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

}  // namespace tilemoe::cli
