#!/usr/bin/env bash
# The figures of issues 4 and 7's lines in one device call: tilemoe's bench (bf16, int8, int4), then
# kt-kernel (bf16, int8, int4) and SGLang's fused MoE, all on the machine of that call, since machines
# of one kind differ by up to 40 % (docs/perf.md opens with where each line stands); REPEAT times
# over, since one machine's processes differ too, and the lines ask for most processes. At the end
# scripts/issue-tables-summary.py prints each line's verdict in each process.
#
#   device: bash scripts/issue-tables.sh   (carry .devdeps, .ktk and .sgl; the peers are skipped
#           where their folder is missing: ../shared/anchors/{ktkernel,sglang} copied to .ktk / .sgl)
#
# Environment: REPEAT (default 1) processes of each; TOKENS (default 1,16,128,512,4096) bf16's token
# counts, INT8_TOKENS (1,512,4096), INT4_TOKENS (1,4096; group 128); SGL_TOKENS (1,16,128: SGLang is
# the slower peer at 512 and 4096 tokens on every machine so far, by 1.4-2x); OUT (default
# /tmp/tilemoe-tables) where the logs go: logs.tar.gz (a file per bench and process; the device tool
# returns a few files only), summary.txt (the CPU and each line's verdicts, also printed last).
# TILEMOE_BIN: a tilemoe already built from this tree (a call that has just run the suite), instead of
# building the command line into /tmp/tables-build.
# Three processes of everything took 200 s after 50 s of builds (session 68).
set -o pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/tilemoe-tables}"
LOGS="$OUT/logs"; mkdir -p "$LOGS"
TOKENS="${TOKENS:-1,16,128,512,4096}" INT8_TOKENS="${INT8_TOKENS:-1,512,4096}" INT4_TOKENS="${INT4_TOKENS:-1,4096}"
SGL_TOKENS="${SGL_TOKENS:-1,16,128}"
cpu=$(lscpu | grep -E "^(Model name|Model|CPU\(s\)):")
echo "$cpu"
# shellcheck source=scripts/device-env.sh
. scripts/device-env.sh
t0=$(date +%s)
[ -d .ktk ] && { bash .ktk/build.sh > "$LOGS/kt-build.txt" 2>&1 & }
[ -d .sgl ] && { bash .sgl/build.sh > "$LOGS/sgl-build.txt" 2>&1 & }
if [ -n "$TILEMOE_BIN" ]; then
  [ -x "$TILEMOE_BIN" ] || { echo "TILEMOE_BIN=$TILEMOE_BIN is not an executable"; exit 1; }
else
  cmake -S . -B /tmp/tables-build -DCMAKE_BUILD_TYPE=Release -DTILEMOE_BUILD_TESTS=OFF -DTILEMOE_BUILD_PYTHON=OFF \
    > "$LOGS/configure.txt" 2>&1 || { tail "$LOGS/configure.txt"; exit 1; }
  cmake --build /tmp/tables-build -j 16 --target tilemoe_cli > "$LOGS/build.txt" 2>&1 || { grep -E "error" "$LOGS/build.txt" | head; exit 1; }
  TILEMOE_BIN=/tmp/tables-build/tilemoe
fi
wait  # no build runs while anything is timed
echo "built in $(( $(date +%s) - t0 )) s"
rows() { grep -E "^ +[0-9]|GB/s, amx|^tokens"; }
tokens_of() { case $1 in bf16) echo "$TOKENS" ;; int8) echo "$INT8_TOKENS" ;; int4) echo "$INT4_TOKENS" ;; esac; }
for p in $(seq 1 "${REPEAT:-1}"); do
  echo "== process $p"
  for w in bf16 int8 int4; do
    t=$(tokens_of "$w")
    [ -n "$t" ] || continue
    echo "-- tilemoe $w"
    "$TILEMOE_BIN" bench --weights "$w" --tokens "$t" --lora-rank 0,16 --lora-held --lora-dtype bf16 2>&1 |
      tee "$LOGS/tilemoe-$w-$p.txt" | rows
  done
  if [ -x .ktk/bench ]; then
    for w in bf16 int8 int4; do
      t=$(tokens_of "$w")
      [ -n "$t" ] || continue
      echo "-- kt-kernel $w"
      .ktk/bench --weights "$w" --qlens "$t" --no-sft 2>&1 | tee "$LOGS/kt-$w-$p.txt" | grep -E "^ +[0-9]"
    done
  fi
  if [ -f .sgl/sgl_moe.so ] && [ -n "$SGL_TOKENS" ]; then
    echo "-- SGLang bf16"
    OMP_NUM_THREADS=16 OMP_PROC_BIND=close OMP_PLACES=threads python3 .sgl/bench_sglang.py --qlens "$SGL_TOKENS" --no-check \
      2>&1 | tee "$LOGS/sgl-$p.txt" | grep -E "^ +[0-9]"
  fi
done
echo "== lines"
{
  echo "$cpu" | sed 's/  */ /g'
  command -v python3 > /dev/null && python3 scripts/issue-tables-summary.py "$LOGS" "${REPEAT:-1}"
} | tee "$OUT/summary.txt"
tar -czf "$OUT/logs.tar.gz" -C "$OUT" logs && rm -rf "$LOGS"
echo "done in $(( $(date +%s) - t0 )) s"
