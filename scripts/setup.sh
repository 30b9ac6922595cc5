#!/usr/bin/env bash
# Everything from a fresh Debian 12 clone:
#   scripts/setup.sh demo   install, build, run `tilemoe demo` (a DeepSeek-V2-Lite-shaped layer)
#   scripts/setup.sh test   install, build, run every test, then again under ASan + UBSan with the
#                           AMX kernels on emulated tiles, and the threaded tests (async API, pool, layers) under ThreadSanitizer
set -euo pipefail
cd "$(dirname "$0")/.."
mode="${1:-demo}"
jobs="$(nproc)"
bash scripts/install-deps.sh

build() {  # build <dir> [cmake args...]
  local dir="$1"; shift
  mkdir -p "$dir"
  cmake -S . -B "$dir" -G Ninja "$@" > "$dir/configure.log" 2>&1 || { cat "$dir/configure.log"; exit 1; }
  cmake --build "$dir" -j "$jobs"
}

case "$mode" in
  demo)
    mkdir -p build
    build build -DCMAKE_BUILD_TYPE=Release -DTILEMOE_BUILD_TESTS=OFF
    ./build/tilemoe demo
    ;;
  test)
    mkdir -p build build-sanitize
    sanitizer_flags=(-DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG")
    build build -DCMAKE_BUILD_TYPE=Release
    (cd build && ctest --output-on-failure -j "$jobs")
    # Sanitizers at -O1 with line tables only (-g1: file and line in their stack traces): GCC
    # compiled the instrumented kernels 4-9x faster than at RelWithDebInfo's -O2 -g, which had made
    # this build most of CI's time. The AMX kernels run there on the software tiles (README, "The AMX
    # path without AMX"): their tests run instead of SKIPPED, and every tile load and store is
    # checked against its buffer.
    build build-sanitize -DCMAKE_BUILD_TYPE=RelWithDebInfo "${sanitizer_flags[@]}" -DTILEMOE_SANITIZE=ON -DTILEMOE_AMX_EMULATION=ON
    (cd build-sanitize && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
       ctest --output-on-failure -j "$jobs")
    # ThreadSanitizer: the async API's test, where threads meet (submits, syncs, the queue),
    # TokenCodes', where gather units race to quantize the same tokens, the thread pool's, whose
    # linked pools lend each other idle helpers, and ItemCountdowns', items waiting for others; then
    # the layers whose forward and backward share out items on the pool's threads (bf16, int8, int4,
    # tensor-parallel slices) and the public API around them: about 3 minutes more here.
    tsan_tests=(test_runtime_async test_token_codes test_thread_pool test_item_countdowns test_api test_moe_forward
                test_moe_backward test_moe_forward_quantized test_moe_backward_quantized test_tensor_parallel)
    mkdir -p build-tsan
    cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "${sanitizer_flags[@]}" -DTILEMOE_TSAN=ON > build-tsan/configure.log 2>&1 ||
      { cat build-tsan/configure.log; exit 1; }
    cmake --build build-tsan -j "$jobs" --target "${tsan_tests[@]}"
    for t in "${tsan_tests[@]}"; do
      TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 "./build-tsan/tests/$t"
    done
    ;;
  *)
    echo "usage: scripts/setup.sh demo|test" >&2
    exit 2
    ;;
esac
