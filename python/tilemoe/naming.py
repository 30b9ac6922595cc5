"""PEFT names of a layer's expert LoRA: "<prefix>.<expert>.<projection>.lora_A.weight", e.g.
"base_model.model.model.layers.1.mlp.experts.0.gate_proj.lora_A.weight", or Mixtral's
"...block_sparse_moe.experts.0.w1..." (w1 gate, w3 up, w2 down). Taken, in this order, from the
layer's adapter (its own keys), its checkpoint (PEFT's "base_model.model." before the model's
names), or for a layer made from memory the DeepSeek/Qwen naming at its layer index."""
import json
import os
import re
from dataclasses import dataclass

from . import safetensors_io

_PROJECTIONS = {"gate_proj": ("gate_proj", "up_proj", "down_proj"), "up_proj": ("gate_proj", "up_proj", "down_proj"),
                "down_proj": ("gate_proj", "up_proj", "down_proj"), "w1": ("w1", "w3", "w2"), "w3": ("w1", "w3", "w2"),
                "w2": ("w1", "w3", "w2")}
_PEFT_ROOT = "base_model.model."


@dataclass(frozen=True)
class PeftNaming:
    prefix: str        # everything before ".<expert>.<projection>", e.g. "base_model.model.model.layers.1.mlp.experts"
    projections: tuple  # the names of gate, up, down, e.g. ("gate_proj", "up_proj", "down_proj")

    def module(self, expert, projection):
        """The PEFT module path of one expert's projection (projection 0 gate, 1 up, 2 down)."""
        return f"{self.prefix}.{expert}.{self.projections[projection]}"

    def key(self, expert, projection, factor):
        """The PEFT parameter name; factor "A" or "B"."""
        return f"{self.module(expert, projection)}.lora_{factor}.weight"

    def base_module(self, expert, projection):
        """The module path inside the model (without PEFT's "base_model.model."), as target_modules sees it."""
        m = self.module(expert, projection)
        return m[len(_PEFT_ROOT):] if m.startswith(_PEFT_ROOT) else m


def default_naming(layer_index):
    return PeftNaming(f"{_PEFT_ROOT}model.layers.{layer_index}.mlp.experts", _PROJECTIONS["gate_proj"])


def _expert_pattern(layer_index, tail):
    # "<anything>layers.<L>.<anything>experts.<E>.<projection><tail>"
    return re.compile(rf"^(.*\blayers\.{layer_index}\.(?:.*\.)?experts)\.\d+\.(gate_proj|up_proj|down_proj|w1|w2|w3){tail}$")


def _find(names, pattern):
    for name in names:
        m = pattern.match(name)
        if m:
            return m.group(1), _PROJECTIONS[m.group(2)]
    return None


def naming_from_checkpoint(model_dir, layer_index):
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            names = list(json.load(f)["weight_map"])
    else:
        names = list(safetensors_io.read_header(os.path.join(model_dir, "model.safetensors")))
    found = _find(names, _expert_pattern(layer_index, r"\.weight"))
    return PeftNaming(_PEFT_ROOT + found[0], found[1]) if found else None


def naming_from_adapter(adapter, layer_index):
    if os.path.isdir(adapter):
        names = list(safetensors_io.read_header(os.path.join(adapter, "adapter_model.safetensors")))
        found = _find(names, _expert_pattern(layer_index, r"\.lora_A(?:\.[^.]+)?\.weight"))
        return PeftNaming(found[0], found[1]) if found else None
    # A `tilemoe convert-lora` file keeps each key as a template in its metadata.
    meta = safetensors_io.read_header(adapter).get("__metadata__", {})
    template = meta.get(f"peft_key.layer_{layer_index}.gate.a", "")
    found = _find([template.replace("{E}", "0")], _expert_pattern(layer_index, r"\.lora_A(?:\.[^.]+)?\.weight"))
    return PeftNaming(found[0], found[1]) if found else None


def naming_of(layer):
    """The naming for a tilemoe.MoELayer (see the module's docstring)."""
    index = layer.layer_index if layer.layer_index is not None else 0
    for source, reader in ((layer.adapter, naming_from_adapter), (layer.model_dir, naming_from_checkpoint)):
        if source is not None:
            found = reader(source, index)
            if found:
                return found
    return default_naming(index)
