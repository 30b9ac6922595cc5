"""tilemoe.torch.MoELoRA: a tilemoe.MoELayer as a torch.nn.Module whose per-expert LoRA A and B are
torch Parameters under their PEFT names, with autograd through the runtime's backward.

    layer = tilemoe.MoELayer.from_checkpoint(model_dir, 1, lora_rank=16, lora_alpha=32)
    moe = MoELoRA(layer)
    opt = torch.optim.AdamW(moe.parameters(), lr=1e-4)
    out = moe(x, expert_ids, weights)        # x [..., hidden], ids int64 [..., k], weights [..., k]
    loss(out).backward(); opt.step()         # the step lands in the memory the runtime reads

Zero copy: each projection's A (and B) of all experts is one contiguous CPU tensor [E, r, in]
([E, out, r]), float32 or bfloat16 (MoELoRA(..., dtype=torch.bfloat16): half the bytes, as
trainers that keep LoRA in bf16 do), that the layer reads in place; each expert's Parameter is a
view of it, so in-place optimizer updates are seen by the next forward. The gradients backward
writes are views of one such tensor per projection too, of the same dtype (bf16 gradients are the
runtime's f32 sums rounded once). The parameters stay where they are whatever the module is moved
or cast to (module.to(...) leaves them: the runtime reads them there); do not assign to a
parameter's .data.

The runtime saves a forward for backward on a stack and pops the newest one: backward must run in
reverse order of the forwards (as autograd does for a graph of one step), with at most
max_cache_depth forwards waiting. A forward whose graph is dropped without backward is popped at
the next call. The routing weights get no gradient (the runtime does not produce one).
"""
import math
import warnings
import weakref

import torch

from . import safetensors_io
from .naming import naming_of

_PROJ = ("gate", "up", "down")


class _Factor(torch.nn.Module):
    """PEFT's lora_A / lora_B: a module holding `weight`."""

    def __init__(self, weight):
        super().__init__()
        self.weight = weight


class _Saved:
    """One forward on the runtime's stack: its token count, which experts it routed to, and whether
    its graph is gone (then it is popped without gradients)."""

    __slots__ = ("tokens", "routed", "abandoned", "done")

    def __init__(self, tokens, routed):
        self.tokens, self.routed, self.abandoned, self.done = tokens, routed, False, False


class _SavedHandle:
    """Held by autograd's ctx: when the graph is freed before backward, the forward is abandoned."""

    def __init__(self, saved):
        self.saved = saved

    def __del__(self):
        if not self.saved.done:
            self.saved.abandoned = True


class _MoEFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, module, x2d, expert_ids, weights, anchor):
        out, saved = module._forward_saving(x2d, expert_ids, weights)
        ctx.module = module
        ctx.handle = _SavedHandle(saved)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        grad_in = ctx.module._backward(ctx.handle.saved, grad_out)
        return None, grad_in, None, None, None


class MoELoRA(torch.nn.Module):
    """LoRA of every expert of `layer` as Parameters named by their PEFT keys.

    The initial values come from the layer's LoRA in use (an adapter it loaded, with its per-expert
    scales); a layer without LoRA gets PEFT's initialisation at `rank` (default: the config's
    lora_rank): A Kaiming-uniform, B zero, scale lora_alpha / rank. `naming` (a
    tilemoe.naming.PeftNaming) overrides the names found for the layer (tilemoe.naming.naming_of).
    dtype: torch.float32 (default) or torch.bfloat16, the parameters' and gradients' dtype.
    The module points the layer at its own arrays: one MoELoRA per layer, and no other
    update_lora_weights on it while the module is in use.

    An adapter that PEFT stacked over the experts (target_parameters on transformers v5's
    experts.gate_up_proj / down_proj; MoELayer.adapter_stacked_keys) has no per-expert keys: its
    experts' parameters are named as a per-expert adapter of the model would be, and
    save_pretrained writes them back stacked under the adapter's keys. gate_up_proj's one A is one
    Parameter per expert shared by gate and up (as in PEFT), its gradient the sum of theirs.
    """

    def __init__(self, layer, *, rank=None, naming=None, generator=None, dtype=torch.float32):
        super().__init__()
        if dtype not in (torch.float32, torch.bfloat16):
            raise TypeError(f"MoELoRA: dtype {dtype}; the runtime reads LoRA factors in torch.float32 or torch.bfloat16")
        self.dtype = dtype
        self.layer = layer
        self.naming = naming or naming_of(layer)
        cfg = layer.config
        self.num_experts, self.hidden = cfg.num_experts, cfg.hidden
        dims = {"gate": (cfg.hidden, cfg.intermediate), "up": (cfg.hidden, cfg.intermediate),
                "down": (cfg.intermediate, cfg.hidden)}

        current = layer.lora_weights()
        # Projections the layer's adapter stacked over the experts (PEFT target_parameters): the
        # parameters stay per expert (each a view of what the runtime reads), save_pretrained writes
        # them back stacked. gate_up_proj's one A serves gate and up: one Parameter for both.
        self._stacked = layer.adapter_stacked_keys()  # empty unless the set in use is the adapter's
        self._shared_a = "gate" in self._stacked and "up" in self._stacked and \
            self._stacked["gate"]["key_a"] == self._stacked["up"]["key_a"]
        self._adapter_config = _adapter_config_text(layer.adapter) if self._stacked else None
        if current:
            for name in _PROJ:
                if name not in current:
                    continue
                p = current[name]
                for key in ("a", "b", "scale"):
                    p[key] = torch.from_numpy(p[key])
                p["present"] = torch.from_numpy(p["present"].astype("uint8"))
            scales = torch.stack([current[n]["scale"] if n in current else torch.zeros(self.num_experts) for n in _PROJ])
            present = torch.stack([current[n]["present"] if n in current else torch.zeros(self.num_experts, dtype=torch.uint8)
                                   for n in _PROJ])
        else:
            rank = cfg.lora_rank if rank is None else rank
            if rank <= 0:
                raise ValueError("MoELoRA: the layer has no LoRA and lora_rank 0; build it with lora_rank > 0 "
                                 "(MoEConfig.lora_rank, or lora_rank= of from_checkpoint) or pass rank=")
            current = {}
            for name in _PROJ:
                fan_in, fan_out = dims[name]
                # PEFT: kaiming_uniform_(a=sqrt(5)) on each expert's A, i.e. U(-1/sqrt(in), 1/sqrt(in)); B zero.
                bound = 1.0 / math.sqrt(fan_in)
                a = torch.empty(self.num_experts, rank, fan_in).uniform_(-bound, bound, generator=generator)
                current[name] = {"a": a, "b": torch.zeros(self.num_experts, fan_out, rank)}
            scales, present = None, None

        # One storage per factor (of `dtype`): the runtime reads these, the Parameters are views.
        self._flat = {}       # "gate_a" -> [E, r, in], ...
        self._grad_flat = {}  # the same shapes: backward writes here
        self._params = []     # (Parameter, its view of _grad_flat, _flat's key, expert) for every present expert
        self._present = present.contiguous() if present is not None else None
        self._scales = scales.contiguous() if scales is not None else None
        root = torch.nn.Module()
        gate_a_params = {}
        for i, name in enumerate(_PROJ):
            if name not in current:
                continue
            for factor, key in (("A", name + "_a"), ("B", name + "_b")):
                if key == "up_a" and self._shared_a:
                    self._flat[key] = self._flat["gate_a"]  # the runtime reads one array for both
                else:
                    self._flat[key] = current[name][factor.lower()].to(dtype).contiguous().clone()
                self._grad_flat[key] = torch.zeros_like(self._flat[key])  # backward writes gate's and up's apart
            for e in range(self.num_experts):
                if present is not None and not present[i, e]:
                    continue
                for factor, key in (("A", name + "_a"), ("B", name + "_b")):
                    if key == "up_a" and self._shared_a:
                        param = gate_a_params[e]  # named once (named_parameters drops the repeat), stepped once
                    else:
                        param = torch.nn.Parameter(self._flat[key][e])
                        self._params.append((param, self._grad_flat[key][e], key, e))
                        if key == "gate_a":
                            gate_a_params[e] = param
                    _attach(root, self.naming.module(e, i) + f".lora_{factor}", _Factor(param))
        # The PEFT module path starts at this module: named_parameters() gives PEFT's keys.
        for child_name, child in root.named_children():
            self.add_module(child_name, child)

        layer.update_lora_weights(**self._flat, scales=self._scales, present=self._present)
        self._saved = []  # the runtime's stack as this module filled it, oldest first
        self._anchor = torch.zeros((), requires_grad=True)  # makes autograd record the call when x needs no grad

    # The parameters live where the runtime reads them: casts and moves leave them there.
    def _apply(self, fn, *args, **kwargs):
        return self

    def forward(self, x, expert_ids, weights):
        """x [..., hidden] (any float dtype and device), expert_ids int [..., k], weights [..., k] ->
        the experts' weighted sum [..., hidden] in x's dtype and device."""
        if x.shape[-1] != self.hidden:
            raise ValueError(f"x: last dimension {x.shape[-1]}, expected hidden = {self.hidden}")
        if expert_ids.is_floating_point() or expert_ids.is_complex():
            raise TypeError(f"expert_ids: dtype {expert_ids.dtype}, expected an integer dtype (torch.int64)")
        if not weights.is_floating_point():
            raise TypeError(f"weights: dtype {weights.dtype}, expected a floating dtype (torch.float32)")
        lead = x.shape[:-1]
        x2d = x.reshape(-1, self.hidden)
        ids = expert_ids.reshape(x2d.shape[0], -1)
        w = weights.reshape(x2d.shape[0], -1)
        if weights.requires_grad and torch.is_grad_enabled():
            warnings.warn("MoELoRA: the routing weights get no gradient (the runtime's backward does not produce one)",
                          stacklevel=2)
        trainable = any(p[0].requires_grad for p in self._params)
        if torch.is_grad_enabled() and (x.requires_grad or trainable):
            out = _MoEFunction.apply(self, x2d, ids, w, self._anchor)
        else:
            out, _ = self._forward_saving(x2d, ids, w, save=False)
        return out.reshape(*lead, self.hidden)

    def _forward_saving(self, x2d, ids, w, save=True):
        self._drop_abandoned()
        xb = x2d.detach().to("cpu", torch.bfloat16).contiguous()
        ids_cpu = ids.detach().to("cpu", torch.int64).contiguous()
        w_cpu = w.detach().to("cpu", torch.float32).contiguous()
        out = torch.empty(xb.shape[0], self.hidden, dtype=torch.float32)
        self.layer.forward_sft(xb, ids_cpu, w_cpu, out, save_for_backward=save)
        saved = None
        if save:
            valid = ids_cpu[ids_cpu >= 0]
            routed = torch.bincount(valid, minlength=self.num_experts) > 0 if valid.numel() else \
                torch.zeros(self.num_experts, dtype=torch.bool)
            saved = _Saved(xb.shape[0], routed.tolist())
            self._saved.append(saved)
        return out.to(x2d.device, x2d.dtype), saved

    def _backward(self, saved, grad_out):
        if saved.done:
            raise RuntimeError("MoELoRA: backward through the same forward twice; the runtime keeps a forward for one "
                               "backward (run the forward again instead of retain_graph)")
        self._drop_abandoned()
        if not self._saved or self._saved[-1] is not saved:
            raise RuntimeError("MoELoRA: the runtime pops saved forwards newest first, but this backward belongs to an "
                               "older forward; run backward in reverse order of the forwards")
        go = grad_out.detach().to("cpu", torch.float32).contiguous()
        grads, accumulate, finish = self._grad_targets(saved)
        grad_in = self.layer.backward(go, None, grads, accumulate=accumulate)
        if self._shared_a:
            # A shared by gate and up: its gradient is the sum of theirs. up's array is left zero,
            # ready for the next backward that adds into it.
            grads["gate_a"].add_(grads["up_a"])
            grads["up_a"].zero_()
        finish()
        saved.done = True
        self._saved.pop()
        self._drop_abandoned()
        return grad_in.to(grad_out.device, grad_out.dtype)

    def _grad_targets(self, saved):
        """Where backward writes, whether it adds, and what to do after. Gradients go straight into
        .grad when it is None or already our view (adding, as autograd accumulates); a .grad the
        caller replaced gets a copy added. Experts without tokens keep the .grad they had (None stays
        None, as in a plain per-expert model, so AdamW leaves them alone)."""
        routed = saved.routed
        trainable = [(p, view, key, e) for p, view, key, e in self._params if p.requires_grad]
        if any(p.grad is not None and (p.grad.data_ptr() != view.data_ptr() or p.grad.shape != view.shape)
               for p, view, _, _ in trainable):
            scratch = {k: torch.empty_like(v) for k, v in self._grad_flat.items()}

            def add_into_grads():
                for p, _, key, e in trainable:
                    if routed[e]:
                        p.grad = scratch[key][e].clone() if p.grad is None else p.grad.add_(scratch[key][e])
            return scratch, False, add_into_grads
        if all(p.grad is None for p, _, _, _ in trainable):
            def attach():
                for p, view, _, e in trainable:
                    if routed[e]:
                        p.grad = view
            return self._grad_flat, False, attach
        fresh = [(p, view) for p, view, _, e in trainable if routed[e] and p.grad is None]
        for _, view in fresh:
            view.zero_()

        def attach_fresh():
            for p, view in fresh:
                p.grad = view
        return self._grad_flat, True, attach_fresh

    def _drop_abandoned(self):
        """Pops forwards whose graph was freed without backward, while they are on top of the stack."""
        while self._saved and self._saved[-1].abandoned:
            top = self._saved[-1]
            zeros = torch.zeros(top.tokens, self.hidden)
            self.layer.backward(zeros, torch.empty_like(zeros), None)
            top.done = True
            self._saved.pop()

    def flat_lora(self):
        """The arrays the runtime reads (of the module's dtype): {"gate_a": [E, r, in], "gate_b": [E, out, r], ...}."""
        return dict(self._flat)

    def save_pretrained(self, directory):
        """Writes a PEFT adapter directory (adapter_config.json + adapter_model.safetensors) with these
        parameters under their PEFT names, ranks and scales off the common ones as rank_pattern /
        alpha_pattern. Projections the layer's adapter stacked over the experts are written stacked
        again, under its keys and with its adapter_config.json."""
        import json
        import os
        os.makedirs(directory, exist_ok=True)
        tensors = self.peft_state_dict()
        if self._stacked:
            config_text = self._adapter_config  # its target_parameters, rank and alpha describe these tensors
        else:
            config_text = json.dumps(self._peft_config(), indent=2)
        safetensors_io.write_tensors(os.path.join(directory, "adapter_model.safetensors"), tensors, {"format": "pt"})
        with open(os.path.join(directory, "adapter_config.json"), "w") as f:
            f.write(config_text)

    def peft_state_dict(self):
        """The LoRA as PEFT's adapter file holds it, {key: tensor} (what save_pretrained writes, e.g. for
        peft.set_peft_model_state_dict): per-expert keys as named_parameters(), and a stacked
        adapter's tensors stacked under its keys. Detached; all but a stacked B view the arrays
        the runtime reads."""
        tensors = {}
        for i, name in enumerate(_PROJ):
            if name + "_a" not in self._flat or name in self._stacked:
                continue
            for e in range(self.num_experts):
                if self._present is None or self._present[i, e]:
                    for factor in ("A", "B"):
                        tensors[self.naming.key(e, i, factor)] = self._flat[f"{name}_{factor.lower()}"][e].detach()
        tensors.update(self._stacked_tensors())
        return tensors

    def _peft_config(self):
        """adapter_config.json for the per-expert keys: r and lora_alpha those of most expert modules,
        rank_pattern / alpha_pattern for the others (a projection of another rank, experts of another
        scale), keyed by module name without its first part ("layers.1.mlp.experts.3.down_proj"),
        which every PEFT version matches as a suffix."""
        modules = []  # (pattern key, rank, alpha); alpha = scale * rank (use_rslora off)
        for i, name in enumerate(_PROJ):
            if name + "_a" not in self._flat:
                continue
            r = self._flat[name + "_a"].shape[1]
            for e in range(self.num_experts):
                if self._present is not None and not self._present[i, e]:
                    continue
                module = self.naming.base_module(e, i)
                modules.append((module.split(".", 1)[-1], r, self._scale_of(i, e) * r))
        if not modules:
            raise ValueError("MoELoRA.save_pretrained: no expert has LoRA")

        def most_common(values):  # the first one seen on a tie
            return max(values, key=values.count)
        r = most_common([m[1] for m in modules])
        alpha = most_common([m[2] for m in modules])
        return {"peft_type": "LORA", "r": r, "lora_alpha": alpha, "use_rslora": False,
                "target_modules": sorted({self.naming.projections[i] for i, n in enumerate(_PROJ) if n + "_a" in self._flat}),
                "bias": "none", "fan_in_fan_out": False, "lora_dropout": 0.0, "init_lora_weights": True,
                "rank_pattern": {k: mr for k, mr, _ in modules if mr != r},
                "alpha_pattern": {k: ma for k, _, ma in modules if ma != alpha},
                "task_type": None, "base_model_name_or_path": None}

    def _scale_of(self, projection, expert):
        """The LoRA scale of one expert's projection, as the runtime applies it."""
        if self._scales is not None:
            return float(self._scales[projection][expert])
        cfg = self.layer.config
        r = self._flat[_PROJ[projection] + "_a"].shape[1]
        alpha = cfg.lora_alpha if cfg.lora_alpha is not None else cfg.lora_rank
        return alpha / (math.sqrt(r) if cfg.use_rslora else r)

    def _stacked_tensors(self):
        """The stacked projections as PEFT stores them: A [r*E, in] (expert e's rows at e*r, which
        [E, r, in] already is), B [b_rows, r*E] (expert e's column j at j*E + e)."""
        out = {}
        for name, keys in self._stacked.items():
            a = self._flat[name + "_a"].detach()
            experts, r, fan_in = a.shape
            out[keys["key_a"]] = a.reshape(experts * r, fan_in)  # gate's and up's when shared: one array
            b = self._flat[name + "_b"].detach()
            rows = b.shape[1]
            if keys["key_b"] not in out:
                out[keys["key_b"]] = torch.zeros(keys["b_rows"], r * experts, dtype=b.dtype)
            step = keys.get("row_step", 1)  # gpt-oss interleaves gate's and up's rows: 2
            first = keys["first_row"]
            out[keys["key_b"]][first:first + (rows - 1) * step + 1:step] = b.permute(1, 2, 0).reshape(rows, r * experts)
        return out


def _adapter_config_text(adapter):
    """The adapter_config.json of a PEFT directory, or the one a `tilemoe convert-lora` file keeps."""
    import os
    if os.path.isdir(adapter):
        with open(os.path.join(adapter, "adapter_config.json")) as f:
            return f.read()
    text = safetensors_io.read_header(adapter).get("__metadata__", {}).get("adapter_config")
    if text is None:
        raise ValueError(f"{adapter}: no adapter_config in the file's metadata, which save_pretrained copies for a "
                         f"stacked LoRA; convert the PEFT adapter again with `tilemoe convert-lora`")
    return text


def _attach(root, dotted, module):
    """Adds `module` at the dotted path under root, creating plain Modules on the way."""
    parts = dotted.split(".")
    node = root
    for part in parts[:-1]:
        child = node._modules.get(part)
        if child is None:
            child = torch.nn.Module()
            node.add_module(part, child)
        node = child
    node.add_module(parts[-1], module)
