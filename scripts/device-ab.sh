#!/usr/bin/env bash
# A/B timing on the AMX device machine: a base commit and the working tree, built side by side in
# one device call and benched in turn, b n n b b n, so that neither build always runs second (the
# second of two processes ran up to 5 % faster with identical code). Machines of one kind differ
# by up to 40 % in bandwidth: compare only within one call.
#
#   here:    bash scripts/device-ab.sh prepare [BASE_COMMIT [OTHER_COMMIT]]
#            (default HEAD; writes build-ab/base, and build-ab/other when given, which git ignores;
#            rounds may then name `o` beside `b` and `n`, e.g. "b n o o n b")
#   device:  bash scripts/device-ab.sh run [ROUNDS] -- BENCH ARGS  (carry .devdeps and build-ab;
#            and .ktk with KT=1)
#
# Environment for `run`: TESTS=1 runs the working tree's whole suite first (AMX tests shown);
# KT=1 also builds kt-kernel's harness (.ktk, ../shared/anchors/ktkernel) and runs it after the
# rounds listed in KT_AFTER (default 3) and at the end, with KT_ARGS (default: --qlens 1,512
# --sft-qlens 512): its runs differ by up to 15 %, so a peer figure wants several; STEP=1 adds a
# fine-tuning step at 512 tokens (weight copy) to every round; SHAPES (default v2-lite) lists the
# bench shapes each round runs. Logs go to $OUT, and at the end scripts/ab-summary.py's table of
# each row's processes, means and neighbouring pairs (also $OUT/summary.txt).
set -o pipefail
cd "$(dirname "$0")/.."
what="${1:-}"; shift || true
if [ "$what" = prepare ]; then
  base="${1:-HEAD}"
  rm -rf build-ab/base build-ab/other && mkdir -p build-ab/base || exit 1
  git archive "$base" | tar -x -C build-ab/base || exit 1
  echo "build-ab/base holds $(git rev-parse --short "$base")"
  if [ -n "${2:-}" ]; then
    mkdir -p build-ab/other && git archive "$2" | tar -x -C build-ab/other || exit 1
    echo "build-ab/other holds $(git rev-parse --short "$2")"
  fi
  exit 0
fi
if [ "$what" != run ]; then
  echo "usage: $0 prepare [BASE_COMMIT] | run [ROUNDS] -- BENCH ARGS" >&2
  exit 2
fi
rounds="b n n b b n"
if [ "${1:-}" != "--" ] && [ -n "${1:-}" ]; then rounds="$1"; shift; fi
[ "${1:-}" = "--" ] && shift
[ -d build-ab/base ] || { echo "no build-ab/base: run '$0 prepare' here and carry build-ab" >&2; exit 1; }
for r in $rounds; do
  case "$r" in
    b | n) ;;
    o) [ -d build-ab/other ] || { echo "round o: no build-ab/other: run '$0 prepare BASE OTHER' here" >&2; exit 1; } ;;
    *) echo "round '$r': rounds are b (base), n (working tree) and o (other)" >&2; exit 1 ;;
  esac
done
OUT="${OUT:-/tmp/tilemoe-ab}"; mkdir -p "$OUT"
lscpu | head -20
# shellcheck source=scripts/device-env.sh
. scripts/device-env.sh
t0=$(date +%s)
tests=OFF; [ "${TESTS:-0}" = 1 ] && tests=ON
# The command-line tool of build-ab/$1 in /tmp/ab-$1, logs to $OUT/$1-*.txt.
build_cli() {
  cmake -S "build-ab/$1" -B "/tmp/ab-$1" -DCMAKE_BUILD_TYPE=Release -DTILEMOE_BUILD_TESTS=OFF -DTILEMOE_BUILD_PYTHON=OFF \
    > "$OUT/$1-configure.txt" 2>&1 && cmake --build "/tmp/ab-$1" -j 6 --target tilemoe_cli > "$OUT/$1-build.txt" 2>&1
}
build_cli base &
base_job=$!
other_job=
if [ -d build-ab/other ]; then
  build_cli other &
  other_job=$!
fi
[ "${KT:-0}" = 1 ] && { bash .ktk/build.sh > "$OUT/kt-build.txt" 2>&1 & }
# Its own build folders, so that the repository's build/ keeps its configuration.
cmake -S . -B /tmp/ab-new -DCMAKE_BUILD_TYPE=Release -DTILEMOE_BUILD_PYTHON=OFF -DTILEMOE_BUILD_TESTS=$tests > "$OUT/configure.txt" 2>&1 ||
  { tail "$OUT/configure.txt"; exit 1; }
cmake --build /tmp/ab-new -j 16 > "$OUT/build.txt" 2>&1 || { grep -E "error" "$OUT/build.txt" | head -30; exit 1; }
wait "$base_job" || { tail -20 "$OUT/base-build.txt"; exit 1; }
[ -z "$other_job" ] || wait "$other_job" || { tail -20 "$OUT/other-build.txt"; exit 1; }
wait
echo "built in $(( $(date +%s) - t0 )) s"
if [ "$tests" = ON ]; then
  (cd /tmp/ab-new && ctest -j 4 -R amx --output-on-failure 2>&1 | tee "$OUT/ctest-amx.txt" | tail -12)
  (cd /tmp/ab-new && ctest -j 4 --output-on-failure 2>&1 | tee "$OUT/ctest.txt" | grep -E "tests passed|\(Failed\)|Timeout")
fi
kt() {
  echo "== kt-kernel"
  # shellcheck disable=SC2086
  .ktk/bench ${KT_ARGS:---qlens 1,512 --sft-qlens 512} 2>&1 | tee -a "$OUT/kt-bench.txt" | grep -E "^ +[0-9]"
}
i=0
for r in $rounds; do
  i=$((i + 1))
  bin=/tmp/ab-base/tilemoe; [ "$r" = n ] && bin=/tmp/ab-new/tilemoe; [ "$r" = o ] && bin=/tmp/ab-other/tilemoe
  echo "== round $i: $r"
  for shape in ${SHAPES:-v2-lite}; do
    echo "-- $shape"
    "$bin" bench --shape "$shape" --phases "$@" 2>&1 | tee -a "$OUT/bench-$r.txt" | grep -E "^ +[0-9]|phases|merge"
  done
  if [ "${STEP:-0}" = 1 ]; then
    "$bin" bench --shape v2-lite --tokens 512 --lora-rank 16 --backward --backward-weight-copy --phases 2>&1 |
      tee -a "$OUT/bench-$r.txt" | grep -E "^ +[0-9]|phases"
  fi
  [ "${KT:-0}" = 1 ] && [[ " ${KT_AFTER:-3} " == *" $i "* ]] && kt
done
[ "${KT:-0}" = 1 ] && kt
if command -v python3 > /dev/null; then
  echo "== summary"
  python3 scripts/ab-summary.py "$OUT" "$rounds" | tee "$OUT/summary.txt"
fi
echo "done in $(( $(date +%s) - t0 )) s"
