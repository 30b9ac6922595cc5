#!/usr/bin/env bash
# CTest's fuzz_loaders_replay: the fuzzer's seeds (scripts/fuzz_seeds.sh) made from a fixture, each
# as it is and in MUTATIONS deterministic mutations, through the loaders' fuzz target built without
# libFuzzer (tests/fuzz/replay_main.cpp): so CI builds that target, and runs it under its sanitizers.
#   test_fuzz_replay.sh TILEMOE REPLAY FIXTURE [MUTATIONS, default 150]
set -euo pipefail
tilemoe=$1 replay=$2 fx=$3 mutations=${4:-150}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
bash "$(dirname "$0")/../../scripts/fuzz_seeds.sh" "$tilemoe" "$fx" "$dir/corpus" "$dir/work"
TILEMOE_FUZZ_FIXTURE="$fx" "$replay" "$mutations" "$dir"/corpus/*
