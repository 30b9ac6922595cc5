// Runs the loaders' fuzz target (fuzz_loaders.cpp) without libFuzzer, so that CI builds it and
// feeds it under its sanitizers: each seed file (a selector byte, then a file's contents, as
// scripts/fuzz_seeds.sh writes them) as it is, then deterministic mutations of it: truncations and
// overwritten bytes, half of them in the first 256 bytes where the headers and their lengths are.
// A loader may refuse an input only by throwing tilemoe::Error (the target catches it); anything
// else aborts this program or trips the sanitizers.
//   fuzz_loaders_replay MUTATIONS SEED...
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace {

struct Xorshift {
  std::uint64_t s;
  std::uint64_t next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  }
  std::size_t below(std::size_t n) { return n == 0 ? 0 : static_cast<std::size_t>(next() % n); }
};

// The next mutation of a seed: the selector byte is kept, so the input reaches the same loader.
std::vector<std::uint8_t> mutate(const std::vector<std::uint8_t>& seed, Xorshift& rng) {
  std::vector<std::uint8_t> m = seed;
  const std::size_t body = m.size() - 1;
  if (rng.below(4) == 0) {
    m.resize(1 + rng.below(body + 1));
    return m;
  }
  const int bytes = 1 + static_cast<int>(rng.below(8));
  for (int b = 0; b < bytes && body > 0; ++b) {
    const std::size_t span = rng.below(2) == 0 ? std::min<std::size_t>(body, 256) : body;
    const std::size_t at = 1 + rng.below(span);
    static const std::uint8_t extremes[] = {0x00, 0xff, 0x7f, 0x80, '"', '{', '}', '[', ']', ',', ':', '9', '-'};
    m[at] = rng.below(2) == 0 ? extremes[rng.below(sizeof extremes)] : static_cast<std::uint8_t>(rng.next());
  }
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: fuzz_loaders_replay MUTATIONS SEED...\n");
    return 2;
  }
  const long mutations = std::strtol(argv[1], nullptr, 10);
  long runs = 0;
  for (int a = 2; a < argc; ++a) {
    std::ifstream in(argv[a], std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "fuzz_loaders_replay: cannot read %s\n", argv[a]);
      return 2;
    }
    const std::vector<std::uint8_t> seed{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    if (seed.empty()) continue;
    LLVMFuzzerTestOneInput(seed.data(), seed.size());
    Xorshift rng{0x9e3779b97f4a7c15ull ^ (static_cast<std::uint64_t>(a) << 32)};
    for (long i = 0; i < mutations; ++i) {
      const std::vector<std::uint8_t> m = mutate(seed, rng);
      LLVMFuzzerTestOneInput(m.data(), m.size());
    }
    runs += 1 + mutations;
  }
  std::printf("fuzz_loaders_replay: %ld inputs from %d seeds, every one refused or read without a fault\n", runs, argc - 2);
  return 0;
}
