// The progress line a terminal sees during long loads, conversions and exports.
#include "catch.hpp"
#include "src/io/progress.hpp"

using tilemoe::io::format_progress_line;

TEST_CASE("progress line: bar, percent, sizes, rate, time left", "[progress]") {
  CHECK(format_progress_line("converting", 0, 1000000000, 0.0) ==
        "converting  [--------------------]  0%  0 B / 1.00 GB  -- MB/s  -- left");
  CHECK(format_progress_line("converting", 250000000, 1000000000, 0.5) ==
        "converting  [#####---------------]  25%  250.0 MB / 1.00 GB  500 MB/s  1.5 s left");
  CHECK(format_progress_line("x", 3000000000, 6000000000, 1.0) == "x  [##########----------]  50%  3.00 GB / 6.00 GB  3.00 GB/s  1.0 s left");
  CHECK(format_progress_line("x", 1500, 3000, 1.0) == "x  [##########----------]  50%  2 kB / 3 kB  2 kB/s  1.0 s left");
}

TEST_CASE("progress line: long waits in minutes and hours", "[progress]") {
  CHECK(format_progress_line("x", 1000000, 100000000, 1.0) == "x  [--------------------]  1%  1.0 MB / 100.0 MB  1 MB/s  1 min 39 s left");
  CHECK(format_progress_line("x", 1000000, 10000000000, 1.0) == "x  [--------------------]  0%  1.0 MB / 10.00 GB  1 MB/s  2 h 46 min left");
  CHECK(format_progress_line("x", 1000000, 10000000, 12.0).ends_with("83 kB/s  1 min 48 s left"));
}

TEST_CASE("progress line: finished shows the time taken, never more than 100%", "[progress]") {
  CHECK(format_progress_line("loading layer 3", 2000000, 2000000, 2.0) ==
        "loading layer 3  [####################]  100%  2.0 MB / 2.0 MB  1 MB/s  in 2.0 s");
  CHECK(format_progress_line("x", 5000, 2000, 20.0).find("100%  2 kB / 2 kB") != std::string::npos);
  CHECK(format_progress_line("x", 0, 0, 0.0) == "x  [####################]  100%  0 B / 0 B  -- MB/s  in 0.0 s");
}
