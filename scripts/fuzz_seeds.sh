#!/usr/bin/env bash
# Seed files for the loaders' fuzz target (tests/fuzz/fuzz_loaders.cpp): each is a selector byte (the
# target's enum Target) followed by a valid file of that kind, made from a fixture directory (model/
# and adapter/). Used by scripts/fuzz.sh (libFuzzer) and by CTest's fuzz_loaders_replay.
#   scripts/fuzz_seeds.sh TILEMOE FIXTURE CORPUS_DIR WORK_DIR
# The stacked forms (transformers v5's experts.gate_up_proj, PEFT's target_parameters LoRA) are made
# by scripts/fuzz_stacked_seeds.py; without python3 they are left out, and the script says so.
set -euo pipefail
tilemoe=$1 fx=$2 corpus=$3 work=$4
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$corpus"
rm -rf "$work" && mkdir -p "$work"
seed() { { printf "\\$(printf %03o "$1")"; cat "$2"; } > "$corpus/seed_$1_$(echo "$2" | tr / _)"; }
"$tilemoe" convert-lora --adapter "$fx/adapter" --model "$fx/model" --output "$work/lora.safetensors" > /dev/null
"$tilemoe" quantize --model "$fx/model" --output "$work/quantized" --weights int8 > /dev/null
"$tilemoe" quantize --model "$fx/model" --output "$work/quantized_mxfp4" --weights mxfp4 > /dev/null
seed 0 "$fx/adapter/adapter_model.safetensors"
for c in "$here"/../tests/data/*/model/config.json "$fx/model/config.json"; do seed 1 "$c"; done
seed 2 "$fx/adapter/adapter_config.json"
seed 3 "$fx/adapter/adapter_model.safetensors"
seed 4 "$work/lora.safetensors"
seed 5 "$(ls "$fx"/model/*.safetensors | head -1)"
seed 6 "$work/quantized/quantization.json"
seed 7 "$(ls "$work"/quantized/layer_*.safetensors | head -1)"
seed 8 "$work/quantized_mxfp4/quantization.json"
seed 9 "$(ls "$work"/quantized_mxfp4/layer_*.safetensors | head -1)"
if ! command -v python3 > /dev/null; then
  echo "fuzz_seeds.sh: no python3, so no seeds of the stacked forms" >&2
  exit 0
fi
python3 "$here/fuzz_stacked_seeds.py" "$fx" "$work"
seed 3 "$work/stacked_adapter.safetensors"
seed 5 "$work/stacked_model.safetensors"
mkdir -p "$work/stacked_adapter"
cp "$fx/adapter/adapter_config.json" "$work/stacked_adapter/"
cp "$work/stacked_adapter.safetensors" "$work/stacked_adapter/adapter_model.safetensors"
"$tilemoe" convert-lora --adapter "$work/stacked_adapter" --model "$fx/model" --output "$work/stacked_lora.safetensors" > /dev/null
seed 4 "$work/stacked_lora.safetensors"
