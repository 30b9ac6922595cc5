#!/usr/bin/env bash
# On the AMX device machine (see ../shared/device/README.md): unpack the carried Debian packages
# (.devdeps), build, run the whole test suite, then the bench. Logs go to $OUT.
#   bash scripts/device-check.sh [tests|bench|all] [bench args...]
set -o pipefail
cd "$(dirname "$0")/.."
what="${1:-all}"; shift || true
OUT="${OUT:-/tmp/tilemoe-out}"; mkdir -p "$OUT"
lscpu | head -20
grep -o -w -E 'amx_bf16|amx_tile|avx512_bf16' /proc/cpuinfo | sort | uniq -c
mkdir -p /opt/deps && for f in .devdeps/*.deb; do dpkg -x "$f" /opt/deps; done
export CMAKE_PREFIX_PATH=/opt/deps/usr
export LD_LIBRARY_PATH=/opt/deps/usr/lib/x86_64-linux-gnu
if [ ! -f /usr/include/hwloc.h ]; then
  echo "no hwloc headers on this machine: using the carried libhwloc-dev"
  export PKG_CONFIG_PATH=/opt/deps/usr/lib/x86_64-linux-gnu/pkgconfig PKG_CONFIG_SYSROOT_DIR=/opt/deps
fi
jobs="$(nproc)"
t0=$(date +%s)
# The device's PyTorch lives in a virtual environment with pip's pybind11: the Python module and
# its tests are built for that python3.
py_opt=()
[ -x /opt/torch/.venv/bin/python3 ] && py_opt=(-DTILEMOE_PYTHON3=/opt/torch/.venv/bin/python3)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "${py_opt[@]}" > "$OUT/configure.txt" 2>&1 || { cat "$OUT/configure.txt"; exit 1; }
cmake --build build -j "$jobs" > "$OUT/build.txt" 2>&1 || { grep -E "error|Error" "$OUT/build.txt" | head -40; exit 1; }
echo "build took $(( $(date +%s) - t0 )) s"
if [ "$what" = tests ] || [ "$what" = all ]; then
  (cd build && ctest --output-on-failure -j 2 2>&1 | tee "$OUT/ctest.txt" | tail -40)
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  ./build/tilemoe bench --shape v2-lite "$@" 2>&1 | tee "$OUT/bench.txt"
fi
