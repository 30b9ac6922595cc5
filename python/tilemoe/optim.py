"""tilemoe.optim.MoEAdamW: torch.optim.AdamW for a tilemoe.torch.MoELoRA, in one fused pass.

A MoELoRA holds a layer's LoRA as one float32 array per factor (gate/up/down A and B, every expert),
with a Parameter per expert viewing it under its PEFT name: 384 Parameters for 64 experts. PyTorch's
AdamW loops over them (or groups them, foreach/fused) and pays per tensor; MoEAdamW updates the six
arrays in one call on the runtime's threads, with the GIL released.

The update is torch.optim.AdamW's (amsgrad and maximize off), parameter by parameter: a Parameter
whose .grad is None is left alone and its step count does not advance, so an expert that got no
token keeps its own bias correction, as with AdamW on the same Parameters. Per-parameter state
(self.state[p]: step, exp_avg, exp_avg_sq) views the fused arrays, so state_dict() is AdamW's, and
load_state_dict() takes AdamW's as well as MoEAdamW's. LR schedulers work on param_groups[0] as
usual.
"""
import math

import torch

from . import _tilemoe
from .torch import MoELoRA


def _check(ok, message):
    if not ok:
        raise ValueError(message)


class MoEAdamW(torch.optim.Optimizer):
    def __init__(self, module, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
        if not isinstance(module, MoELoRA):
            raise TypeError(f"MoEAdamW: module is a {type(module).__name__}, expected a tilemoe.torch.MoELoRA")
        if module.dtype != torch.float32:
            raise TypeError(f"MoEAdamW: the module's LoRA is {module.dtype}; the fused update keeps float32 parameters and "
                            "state (use torch.optim.AdamW for a bfloat16 MoELoRA)")
        lr_value = float(lr)
        _check(math.isfinite(lr_value) and lr_value >= 0, f"MoEAdamW: invalid lr {lr}: must be finite and >= 0")
        _check(len(betas) == 2 and all(0.0 <= float(b) < 1.0 for b in betas), f"MoEAdamW: invalid betas {betas}: each in [0, 1)")
        _check(math.isfinite(eps) and eps >= 0, f"MoEAdamW: invalid eps {eps}: must be finite and >= 0")
        _check(math.isfinite(weight_decay) and weight_decay >= 0,
               f"MoEAdamW: invalid weight_decay {weight_decay}: must be finite and >= 0")
        # (Parameter, its view of the grad array, array key, expert) in module.parameters() order, the
        # order an AdamW over module.parameters() has, so that state_dicts go from one to the other.
        entry = {id(p): (p, view, key, e) for p, view, key, e in module._params}
        self._entries = [entry[id(p)] for p in module.parameters() if id(p) in entry]
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, amsgrad=False, maximize=False)
        super().__init__([p for p, _, _, _ in self._entries], defaults)
        self._module = module
        # The arrays that own parameters: not up's A where gate and up share one (MoELoRA keeps it as gate's).
        stepped = {key for _, _, key, _ in module._params}
        self._flat = {k: v for k, v in module._flat.items() if k in stepped}
        self._grad_flat = module._grad_flat
        self._exp_avg = {k: torch.zeros_like(v) for k, v in self._flat.items()}
        self._exp_avg_sq = {k: torch.zeros_like(v) for k, v in self._flat.items()}
        # Each expert's step count per array, float32 as AdamW keeps it; state[p]["step"] views it.
        self._steps = {k: torch.zeros(v.shape[0], dtype=torch.float32) for k, v in self._flat.items()}

    def add_param_group(self, param_group):
        if self.param_groups:
            raise NotImplementedError("MoEAdamW: one parameter group, the module's LoRA; use another optimizer for "
                                      "other parameters")
        super().add_param_group(param_group)

    def _bind_state(self, p, key, e):
        self.state[p] = {"step": self._steps[key][e], "exp_avg": self._exp_avg[key][e], "exp_avg_sq": self._exp_avg_sq[key][e]}

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        group = self.param_groups[0]
        if group.get("amsgrad") or group.get("maximize"):
            raise NotImplementedError("MoEAdamW: amsgrad and maximize are not supported; use torch.optim.AdamW")
        lr = float(group["lr"])
        beta1, beta2 = (float(b) for b in group["betas"])
        masks = {k: torch.zeros(v.shape[0], dtype=torch.bool) for k, v in self._flat.items()}
        for p, view, key, e in self._entries:
            g = p.grad
            if g is None:
                continue
            if g.is_sparse:
                raise RuntimeError("MoEAdamW: sparse gradients are not supported")
            if g.data_ptr() != view.data_ptr() or g.shape != view.shape or g.dtype != torch.float32 or g.device != view.device:
                view.copy_(g)  # a .grad the caller made: the fused pass reads the module's gradient array
            masks[key][e] = True
            if p not in self.state or not self.state[p]:
                self._bind_state(p, key, e)
        groups = []
        for key, flat in self._flat.items():
            mask = masks[key]
            if not bool(mask.any()):
                continue
            steps = self._steps[key]
            steps.add_(mask.to(torch.float32))
            numbers = torch.where(mask, steps, torch.zeros_like(steps)).to(torch.int64)
            groups.append((flat, self._grad_flat[key], self._exp_avg[key], self._exp_avg_sq[key], numbers))
        _tilemoe._adamw_step(self._module.layer.runtime, lr, beta1, beta2, float(group["eps"]), float(group["weight_decay"]),
                             groups)
        return loss

    def load_state_dict(self, state_dict):
        """Takes a MoEAdamW's or a torch.optim.AdamW's state_dict for the same module's parameters."""
        super().load_state_dict(state_dict)
        loaded = {p: {k: (v.detach().clone() if torch.is_tensor(v) else v) for k, v in s.items()} for p, s in self.state.items()}
        for arrays in (self._exp_avg, self._exp_avg_sq, self._steps):
            for a in arrays.values():
                a.zero_()
        self.state.clear()
        where = {id(p): (key, e) for p, _, key, e in self._entries}
        for p, s in loaded.items():
            if not s:
                continue
            if s.get("max_exp_avg_sq") is not None:
                raise NotImplementedError("MoEAdamW.load_state_dict: an amsgrad state; MoEAdamW has no amsgrad")
            key, e = where[id(p)]
            self._steps[key][e] = float(s["step"])
            self._exp_avg[key][e].copy_(s["exp_avg"])
            self._exp_avg_sq[key][e].copy_(s["exp_avg_sq"])
            self._bind_state(p, key, e)
