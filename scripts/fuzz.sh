#!/usr/bin/env bash
# Fuzzes every file tilemoe reads (safetensors, config.json, PEFT adapters, convert-lora files,
# checkpoints, quantized directories) with libFuzzer under ASan + UBSan: tests/fuzz/fuzz_loaders.cpp.
#   scripts/fuzz.sh [seconds, default 600] [jobs, default 1] [fixture: original_moe_tiny (default) or gpt_oss]
# gpt_oss: a tiny gpt-oss checkpoint and PEFT adapter made by scripts/fuzz_gpt_oss_fixture.py (x W
# stacks with biases, MXFP4 blocks, a router bias, a stacked adapter with interleaved rows).
# Needs clang (Debian's clang-14 has libFuzzer) and the Release build's tilemoe (scripts/setup.sh
# test), which writes the seed files. Everything goes to .fuzz/; findings to .fuzz/crashes/, each
# replayed by running .fuzz/fuzz_loaders on it.
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-600}"
jobs="${2:-1}"
fixture="${3:-original_moe_tiny}"
out=.fuzz
command -v clang++ > /dev/null || { echo "fuzz.sh: clang++ not found (apt-get install clang)" >&2; exit 1; }
[ -x build/tilemoe ] || { echo "fuzz.sh: build/tilemoe not found: run scripts/setup.sh test first" >&2; exit 1; }
mkdir -p "$out/obj" "$out/corpus" "$out/work" "$out/crashes"

flags=(-g -O1 -std=c++20 -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -I. -Iinclude)
sources=(src/error.cpp src/io/*.cpp src/model/*.cpp src/lora/*.cpp src/quant/*.cpp numa/thread_pool.cpp numa/topology.cpp numa/node_memory.cpp
         tests/fuzz/fuzz_loaders.cpp)
# Every object is rebuilt: one kept because it is newer than its .cpp may predate a header it
# includes, and a stale object linked beside fresh ones gives false findings.
rm -f "$out"/obj/*.o
printf '%s\n' "${sources[@]}" |
  xargs -P "$(nproc)" -I{} sh -c 'o="$1/obj/$(echo "$2" | tr / _).o"; s="$2"; shift 2; clang++ "$@" -c "$s" -o "$o"' \
    _ "$out" {} "${flags[@]}"
clang++ -fsanitize=fuzzer,address,undefined "$out"/obj/*.o -o "$out/fuzz_loaders" -lpthread -lhwloc -lnuma

# Seeds: each target's selector byte (tests/fuzz/fuzz_loaders.cpp, enum Target) and a valid file.
fx=tests/data/original_moe_tiny
if [ "$fixture" = gpt_oss ]; then
  fx="$out/gpt_oss_fixture"
  rm -rf "$fx" && python3 scripts/fuzz_gpt_oss_fixture.py "$fx"
elif [ "$fixture" != original_moe_tiny ]; then
  echo "fuzz.sh: fixture '$fixture': give original_moe_tiny or gpt_oss" >&2
  exit 1
fi
export TILEMOE_FUZZ_FIXTURE="$fx"
bash scripts/fuzz_seeds.sh build/tilemoe "$fx" "$out/corpus" "$out/seed_dir"

parallel=()
[ "$jobs" -gt 1 ] && parallel=(-jobs="$jobs" -workers="$jobs")
"$out/fuzz_loaders" -max_total_time="$secs" "${parallel[@]}" -max_len=800000 -timeout=30 -rss_limit_mb=4096 \
  -artifact_prefix="$out/crashes/" "$out/work" "$out/corpus"
