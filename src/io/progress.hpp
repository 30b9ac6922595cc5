#pragma once
// Progress of long reads and writes: the callback that loaders and converters report bytes to,
// and the one line of text a terminal shows for it (tools/progress_bar draws it).
#include <cstddef>
#include <functional>
#include <string>

namespace tilemoe::io {

using ProgressFn = std::function<void(std::size_t done_bytes, std::size_t total_bytes)>;

// "label  [#######-------------]  35%  1.20 GB / 3.40 GB  850 MB/s  3.1 s left". Without a measurable
// rate (nothing done yet, or no time elapsed) rate and time left read "--"; once done reaches
// total the time left becomes the time taken ("in 4 s").
std::string format_progress_line(const std::string& label, std::size_t done, std::size_t total, double elapsed_s);

}  // namespace tilemoe::io

namespace tilemoe {
using io::ProgressFn;
}
