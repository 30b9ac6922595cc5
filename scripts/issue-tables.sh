#!/usr/bin/env bash
# The figures of issues 4 and 7's lines in one device call: tilemoe's bench (bf16, then int8), then
# kt-kernel (bf16 and int8) and SGLang's fused MoE, all on the machine of that call, since machines of
# one kind differ by up to 40 % (docs/perf.md opens with where each line stands).
#
#   device: bash scripts/issue-tables.sh   (carry .devdeps, .ktk and .sgl; the peers are skipped
#           where their folder is missing: ../shared/anchors/{ktkernel,sglang} copied to .ktk / .sgl)
#
# Environment: TOKENS (default 1,512,4096) the bf16 token counts, INT8_TOKENS (default 1,512,4096),
# SGL_TOKENS (default 1,4096: SGLang is the best peer at decode at most, kt-kernel at 512 and 4096),
# OUT (default /tmp/tilemoe-tables) where the logs go.
set -o pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/tilemoe-tables}"; mkdir -p "$OUT"
lscpu | grep -E "^(Model name|Model|CPU\(s\)):"
mkdir -p /opt/deps && for f in .devdeps/*.deb; do dpkg -x "$f" /opt/deps; done
export CMAKE_PREFIX_PATH=/opt/deps/usr LD_LIBRARY_PATH=/opt/deps/usr/lib/x86_64-linux-gnu
if [ ! -f /usr/include/hwloc.h ]; then
  export PKG_CONFIG_PATH=/opt/deps/usr/lib/x86_64-linux-gnu/pkgconfig PKG_CONFIG_SYSROOT_DIR=/opt/deps
  export CPATH=/opt/deps/usr/include LIBRARY_PATH=/opt/deps/usr/lib/x86_64-linux-gnu
fi
t0=$(date +%s)
[ -d .ktk ] && { bash .ktk/build.sh > "$OUT/kt-build.txt" 2>&1 & }
[ -d .sgl ] && { bash .sgl/build.sh > "$OUT/sgl-build.txt" 2>&1 & }
cmake -S . -B /tmp/tables-build -DCMAKE_BUILD_TYPE=Release -DTILEMOE_BUILD_TESTS=OFF -DTILEMOE_BUILD_PYTHON=OFF \
  > "$OUT/configure.txt" 2>&1 || { tail "$OUT/configure.txt"; exit 1; }
cmake --build /tmp/tables-build -j 16 --target tilemoe_cli > "$OUT/build.txt" 2>&1 || { grep -E "error" "$OUT/build.txt" | head; exit 1; }
wait  # no build runs while anything is timed
echo "built in $(( $(date +%s) - t0 )) s"
bench() {
  /tmp/tables-build/tilemoe bench --lora-rank 0,16 --lora-held --lora-dtype bf16 "$@" 2>&1 | tee -a "$OUT/tilemoe.txt" |
    grep -E "^ +[0-9]|GB/s|TFLOP"
}
echo "== tilemoe bf16"
bench --tokens "${TOKENS:-1,512,4096}"
echo "== tilemoe int8"
bench --weights int8 --tokens "${INT8_TOKENS:-1,512,4096}"
if [ -x .ktk/bench ]; then
  echo "== kt-kernel bf16"
  .ktk/bench --qlens "${TOKENS:-1,512,4096}" --no-sft 2>&1 | tee -a "$OUT/kt.txt" | grep -E "^ +[0-9]"
  echo "== kt-kernel int8"
  .ktk/bench --weights int8 --qlens "${INT8_TOKENS:-1,512,4096}" --no-sft 2>&1 | tee -a "$OUT/kt.txt" | grep -E "^ +[0-9]"
fi
if [ -f .sgl/sgl_moe.so ]; then
  echo "== SGLang bf16"
  OMP_NUM_THREADS=16 OMP_PROC_BIND=close OMP_PLACES=threads python3 .sgl/bench_sglang.py --qlens "${SGL_TOKENS:-1,4096}" --no-check \
    2>&1 | tee "$OUT/sgl.txt" | tail -8
fi
echo "done in $(( $(date +%s) - t0 )) s"
