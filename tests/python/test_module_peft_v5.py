"""The stacked forms against transformers v5 and PEFT themselves (an outside oracle; the device
machine has both, elsewhere this test is SKIPPED): tiny Qwen3-MoE, Qwen2-MoE, DeepSeek-V3, GLM-4-MoE
(both with a random e_score_correction_bias), Mixtral, OLMoE, ERNIE-4.5-MoE (its moe_statics bias random
too), Hunyuan-MoE, GraniteMoE, DeepSeek-V4 (a clamped SwiGLU, saved in DeepSeek's own names, layer 0
hash-routed) and gpt-oss (x W stacks, gate and up interleaved, biases, its SwiGLU) models as transformers v5 builds them (experts.gate_up_proj [E, 2I, H],
experts.down_proj [E, H, I]; saved per expert, or as Granite's input_linear / output_linear), saved
with save_pretrained in bf16, and a PEFT LoRA on those tensors (target_parameters: PEFT's
ParamWrapper, one A shared by gate and up), saved with PEFT's save_pretrained. For every MoE layer:
- tilemoe.torch.MoELoRA on the checkpoint and adapter gives the experts module's output under PEFT
  and grad_input within 1e-2, and PEFT's LoRA gradients (stacked A and B) within 2e-2, norm-wise;
- the module's LoRA, changed, saved with save_pretrained and loaded by PEFT (PeftModel.from_pretrained)
  into the same model, gives the module's output within 1e-2;
- `tilemoe forward --tokens` routes with the checkpoint's router to the experts and weights the
  model's own MoE block gives its experts module (1e-5), and its output is theirs under PEFT (1e-2);
- `tilemoe backward --input` writes the output, grad_input (1e-2) and PEFT's stacked gradients
  (2e-2) under the adapter's keys.

Usage: test_module_peft_v5.py <tests/data> <cmake> <build dir>. Exits 77 (SKIPPED) without torch, transformers >= 5 or peft.
"""
import inspect
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np  # noqa: F401  (tilemoe needs it)
    import torch
    import transformers
    import peft
except ImportError as e:
    print(f"{e}: transformers v5 and peft are not installed here: skipped")
    sys.exit(77)
if int(transformers.__version__.split(".")[0]) < 5:
    print(f"transformers {transformers.__version__} keeps experts per module; this test needs v5's stacked ones: skipped")
    sys.exit(77)

import tilemoe
from tilemoe import safetensors_io
from tilemoe.torch import MoELoRA
from checks import expect, rel, finish

CLI = os.path.join(sys.argv[3], "tilemoe") if len(sys.argv) > 3 else None  # the build directory's command line


def tiny_model(kind):
    common = dict(vocab_size=64, hidden_size=72, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                  head_dim=32, num_experts_per_tok=2, max_position_embeddings=64, tie_word_embeddings=False)
    if kind == "qwen3_moe":
        config = transformers.Qwen3MoeConfig(intermediate_size=96, moe_intermediate_size=40, num_experts=5,
                                             decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True, **common)
    elif kind == "qwen2_moe":
        config = transformers.Qwen2MoeConfig(intermediate_size=96, moe_intermediate_size=40, shared_expert_intermediate_size=48,
                                             num_experts=5, decoder_sparse_step=1, mlp_only_layers=[], **common)
    elif kind == "deepseek_v3":  # layer 0 dense (first_k_dense_replace), layer 1 MoE beside a shared expert
        config = transformers.DeepseekV3Config(intermediate_size=96, moe_intermediate_size=40, n_routed_experts=5,
                                               n_shared_experts=1, first_k_dense_replace=1, n_group=1, topk_group=1,
                                               q_lora_rank=32, kv_lora_rank=32, qk_rope_head_dim=16, qk_nope_head_dim=16,
                                               v_head_dim=16, **common)
    elif kind == "glm4_moe":  # as DeepSeek-V3: sigmoid scores, noaux_tc, layer 0 dense
        config = transformers.Glm4MoeConfig(intermediate_size=96, moe_intermediate_size=40, n_routed_experts=5,
                                            n_shared_experts=1, first_k_dense_replace=1, n_group=1, topk_group=1,
                                            routed_scaling_factor=1.8, **common)
    elif kind == "olmoe":  # intermediate_size the experts', top-k not renormalised
        config = transformers.OlmoeConfig(intermediate_size=40, num_experts=5, norm_topk_prob=False, **common)
    elif kind in ("ernie4_5_moe", "hunyuan_v1_moe", "granitemoe"):
        # ERNIE-4.5 (softmax router with a moe_statics correction bias, layer 0 dense), Hunyuan-MoE
        # (router gate.wg) and GraniteMoE (experts saved as block_sparse_moe.input_linear / output_linear)
        fields = dict(common, intermediate_size=96 if kind == "ernie4_5_moe" else 40, moe_intermediate_size=40, moe_num_experts=5,
                      moe_k=2, moe_layer_start_index=1, moe_num_shared_experts=1, num_experts=5, moe_topk=2, num_local_experts=5)
        cls = transformers.CONFIG_MAPPING[kind]
        params = inspect.signature(cls.__init__).parameters
        config = cls(**{k: v for k, v in fields.items() if k in params})
    elif kind == "deepseek_v4":
        # Saved by transformers in DeepSeek's own names (ffn.experts.{e}.w1/w2/w3, the correction bias
        # as ffn.gate.bias); layer 0 hash-routed; a swiglu_limit in the tail of the gates and ups under
        # this LoRA (their spread is about 2): the gradient jumps at the bounds, where a value within
        # rounding of one could be clamped by one side only.
        config = transformers.CONFIG_MAPPING[kind](moe_intermediate_size=40, n_routed_experts=5, n_shared_experts=1, q_lora_rank=32,
                                                   mlp_layer_types=["hash_moe", "moe"], swiglu_limit=5.0, **common)
    elif kind == "gpt_oss":
        # gpt-oss: experts stacked as x W with gate and up interleaved and biases; its module clamps at
        # a fixed 7, which these weights meet once scaled (below), in the tail.
        config = transformers.CONFIG_MAPPING[kind](intermediate_size=40, num_local_experts=5, **common)
    else:
        config = transformers.MixtralConfig(intermediate_size=40, num_local_experts=5, **common)
    torch.manual_seed(7)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_((torch.randn(p.shape) / p.shape[-1] ** 0.5).to(torch.bfloat16).float())
        # noaux_tc chooses with score + bias and weighs with the score alone; transformers starts the
        # bias at zero, which would not tell the two apart. Large enough to change the choice.
        for n, b in list(model.named_buffers()) + list(model.named_parameters()):
            if n.endswith("e_score_correction_bias"):
                b.copy_((torch.randn(b.shape) * 0.3).to(torch.bfloat16).float())
            if kind == "gpt_oss" and n.endswith("experts.gate_up_proj"):
                b.copy_((b * 3.0).to(torch.bfloat16).float())
    return model


def experts_of(model, layer):
    """The layer's experts module (stacked gate_up_proj / down_proj, or PEFT's wrapper of it) and its name."""
    for name, module in model.named_modules():  # parents first: PEFT's outermost wrapper when wrapped
        if f".layers.{layer}." in name and name.endswith(".experts"):
            return name, module
    return None, None  # a dense layer


def unwrap(name):
    return name.replace("base_model.model.", "", 1)


def stacked_grads(m, keys, experts):
    """PEFT's stacked LoRA gradients from the module's per-expert ones: {key: tensor}."""
    out = {}
    for i, name in enumerate(("gate", "up", "down")):
        k = keys[name]

        def grad(e, factor):
            g = m.get_submodule(m.naming.module(e, i) + f".lora_{factor}").weight.grad
            return torch.zeros_like(m.get_submodule(m.naming.module(e, i) + f".lora_{factor}").weight) if g is None else g
        out[k["key_a"]] = torch.cat([grad(e, "A") for e in range(experts)])  # shared: gate's holds the sum
        b = torch.stack([grad(e, "B") for e in range(experts)], dim=2)  # [out, r, E]
        full = out.setdefault(k["key_b"], torch.zeros(k["b_rows"], b.shape[1] * experts))
        first, step = k["first_row"], k.get("row_step", 1)  # gpt-oss interleaves gate's and up's rows
        full[first:first + (b.shape[0] - 1) * step + 1:step] = b.reshape(b.shape[0], -1)
    return out


def routed_by_transformers(kind, layer, x):
    """(top_k_index, top_k_weights) the model's own MoE block gives its experts for x [T, H]."""
    model = tiny_model(kind)
    name, experts = experts_of(model, layer)
    block = model.get_submodule(name.rsplit(".", 1)[0])
    seen = {}

    def hook(module, args, kwargs):
        seen["ids"], seen["weights"] = (list(args[1:]) + [kwargs.get("top_k_index"), kwargs.get("top_k_weights")])[:2]
    handle = experts.register_forward_pre_hook(hook, with_kwargs=True)
    with torch.no_grad():
        block(x[None])
    handle.remove()
    bias = getattr(getattr(block, "gate", None), "e_score_correction_bias", None)
    expect((bias is not None) == (kind in ("deepseek_v3", "glm4_moe", "deepseek_v4")), f"{kind}: e_score_correction_bias not where expected")
    if bias is not None:  # the test says nothing of the bias unless it changes what is chosen
        logits = x.float() @ block.gate.weight.float().T
        scores = torch.nn.functional.softplus(logits).sqrt() if kind == "deepseek_v4" else torch.sigmoid(logits)
        unbiased = scores.topk(seen["ids"].shape[1], dim=1).indices
        expect(not torch.equal(unbiased.sort(dim=1).values, seen["ids"].sort(dim=1).values),
               f"{kind} layer {layer}: e_score_correction_bias changes no token's experts")
    return seen["ids"], seen["weights"]


def cli_against_transformers(kind, layer, model_dir, adapter_dir, experts, tmp):
    """`tilemoe forward --tokens` routes with the checkpoint's router as transformers does, and its
    output is the experts module's under PEFT."""
    where = f"{kind} layer {layer} (tilemoe forward --tokens)"
    out = os.path.join(tmp, f"cli_{kind}_{layer}.safetensors")
    run = subprocess.run([CLI, "forward", "--model", model_dir, "--layer", str(layer), "--adapter", adapter_dir, "--tokens", "17",
                          "--seed", "3", "--output", out], capture_output=True, text=True)
    expect(run.returncode == 0, f"{where}: failed: {run.stderr}")
    if run.returncode != 0:
        return
    got = safetensors_io.read_tensors(out)
    x = torch.from_numpy(got["input"])
    ids, w = routed_by_transformers(kind, layer, x)
    mine_ids, mine_w = torch.from_numpy(got["expert_ids"]), torch.from_numpy(got["weights"])
    order, mine_order = ids.sort(dim=1), mine_ids.sort(dim=1)
    same_ids = torch.equal(order.values, mine_order.values)
    expect(same_ids, f"{where}: experts chosen differ from transformers' ({ids.tolist()} against {mine_ids.tolist()})")
    if same_ids:
        err = rel(mine_w.gather(1, mine_order.indices), w.float().gather(1, order.indices))
        print(f"{where}: the router's experts as transformers', weights {err:.2e}")
        expect(err <= 1e-5, f"{where}: routing weights differ from transformers' by {err:.2e}")
    with torch.no_grad():
        want = experts(x.float(), ids, w.float())
    err = rel(torch.from_numpy(got["output"]), want)
    print(f"{where}: output {err:.2e} against transformers + PEFT")
    expect(err <= 1e-2, f"{where}: output differs from PEFT's by {err:.2e}")


def cli_backward_against_peft(where, layer, model_dir, adapter_dir, batch, want, peft_grads, tmp):
    """`tilemoe backward --input` on the same batch: output, grad_input and the gradients it writes
    under the adapter's stacked keys (grad.<key>) against transformers + PEFT."""
    x, ids, w, go, grad_input = batch
    where = where + " (tilemoe backward --input)"
    inp, out = os.path.join(tmp, "cli_in.safetensors"), os.path.join(tmp, "cli_out.safetensors")
    safetensors_io.write_tensors(inp, {"input": x.to(torch.bfloat16), "expert_ids": ids, "weights": w, "grad_output": go})
    run = subprocess.run([CLI, "backward", "--model", model_dir, "--layer", str(layer), "--adapter", adapter_dir, "--input", inp,
                          "--output", out], capture_output=True, text=True)
    expect(run.returncode == 0, f"{where}: failed: {run.stderr}")
    if run.returncode != 0:
        return
    got = {k: torch.from_numpy(v) for k, v in safetensors_io.read_tensors(out).items()}
    e_out, e_dx = rel(got["output"], want), rel(got["grad_input"], grad_input)
    print(f"{where}: output {e_out:.2e}, grad_input {e_dx:.2e}")
    expect(e_out <= 1e-2 and e_dx <= 1e-2, f"{where}: output {e_out:.2e}, grad_input {e_dx:.2e} against PEFT's")
    grads = {k[len("grad."):]: v for k, v in got.items() if k.startswith("grad.")}
    expect(len(grads) == 4, f"{where}: {len(grads)} gradients written, expected the adapter's 4 stacked tensors: {sorted(grads)}")
    for key, g in grads.items():
        ref = [p for n, p in peft_grads.items() if unwrap(n).replace(".default.", ".") == unwrap(key)]
        expect(len(ref) == 1 and ref[0].grad is not None and g.shape == ref[0].grad.shape, f"{where}: no PEFT gradient like '{key}'")
        if len(ref) == 1 and ref[0].grad is not None and g.shape == ref[0].grad.shape:
            err = rel(g, ref[0].grad)
            expect(err <= 2e-2, f"{where}: the gradient of {key} differs from PEFT's by {err:.2e}")
    print(f"{where}: {len(grads)} stacked gradients against PEFT's")


def run(kind, tmp):
    model = tiny_model(kind)
    model_dir, adapter_dir, saved_dir = (os.path.join(tmp, kind, n) for n in ("model", "adapter", "saved"))
    model.to(torch.bfloat16).save_pretrained(model_dir, safe_serialization=True)
    model.float()
    lora = peft.LoraConfig(r=4, lora_alpha=12, target_modules=[], init_lora_weights=False,
                           target_parameters=["experts.gate_up_proj", "experts.down_proj"])
    pm = peft.get_peft_model(model, lora)
    torch.manual_seed(8)
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_" in n:
                p.copy_(torch.randn(p.shape) * 0.2)
    pm.save_pretrained(adapter_dir)
    peft_grads = {n: p for n, p in pm.named_parameters() if "lora_" in n}
    E, K, H = 5, 2, 72
    moe_layers = 0
    for layer in range(2):
        where = f"{kind} layer {layer}"
        name, experts = experts_of(pm, layer)
        if experts is None:
            continue
        moe_layers += 1
        gen = torch.Generator().manual_seed(100 + layer)
        T = 13
        x = torch.randn(T, H, generator=gen).to(torch.bfloat16).float()
        ids = torch.stack([torch.randperm(E, generator=gen)[:K] for _ in range(T)])
        w = torch.softmax(torch.randn(T, K, generator=gen), dim=1)
        go = torch.randn(T, H, generator=gen)

        pm.zero_grad(set_to_none=True)
        xr = x.clone().requires_grad_()
        want = experts(xr, ids, w)
        (want * go).sum().backward()
        clamping = [mod for mod in experts.modules() if isinstance(getattr(mod, "limit", None), float)]
        expect(bool(clamping) == (kind in ("deepseek_v4", "gpt_oss")), f"{where}: {len(clamping)} experts modules with a swiglu limit")
        for mod in clamping:  # the limit must be met by this batch, or this checks nothing of it
            limit, mod.limit = mod.limit, float("inf")
            with torch.no_grad():
                moved = rel(experts(x, ids, w), want.detach())
            mod.limit = limit
            print(f"{where}: swiglu_limit {limit} moves the output by {moved:.2e}")
            expect(moved > 5e-3, f"{where}: swiglu_limit {limit} changes nothing here ({moved:.2e})")

        ml = tilemoe.MoELayer.from_checkpoint(model_dir, layer, adapter=adapter_dir, max_tokens=64)
        keys = ml.adapter_stacked_keys()
        expect(set(keys) == {"gate", "up", "down"} and keys["gate"]["key_a"] == keys["up"]["key_a"],
               f"{where}: the adapter is read as stacked, one A for gate and up: {keys}")
        if set(keys) != {"gate", "up", "down"}:
            continue
        m = MoELoRA(ml)
        xo = x.clone().requires_grad_()
        got = m(xo, ids, w)
        (got * go).sum().backward()
        e_out, e_dx = rel(got.detach(), want.detach()), rel(xo.grad, xr.grad)
        print(f"{where}: output {e_out:.2e}, grad_input {e_dx:.2e} against transformers + PEFT")
        expect(e_out <= 1e-2, f"{where}: output differs from PEFT's by {e_out:.2e}")
        expect(e_dx <= 1e-2, f"{where}: grad_input differs from PEFT's by {e_dx:.2e}")
        if CLI:
            if (getattr(model.config, "mlp_layer_types", None) or [None] * 2)[layer] == "hash_moe":
                print(f"{where}: hash-routed: tilemoe forward --tokens not tried (its router needs token ids)")
            else:
                cli_against_transformers(kind, layer, model_dir, adapter_dir, experts, tmp)
            cli_backward_against_peft(where, layer, model_dir, adapter_dir, (x, ids, w, go, xr.grad), want.detach(), peft_grads, tmp)
        mine = stacked_grads(m, keys, E)
        for key, g in mine.items():
            ref = [p for n, p in peft_grads.items() if unwrap(n).replace(".default.", ".") == unwrap(key)]
            expect(len(ref) == 1, f"{where}: PEFT has no parameter for '{key}'")
            if len(ref) == 1:
                err = rel(g, ref[0].grad)
                print(f"{where}: {key.split('experts.')[-1]} gradient {err:.2e}")
                expect(err <= 2e-2, f"{where}: the gradient of {key} differs from PEFT's by {err:.2e}")

        # The module's LoRA, changed, saved and loaded by PEFT into the same base model.
        with torch.no_grad():
            for p in m.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=gen))
            mine_out = m(x, ids, w)
        out_dir = f"{saved_dir}_{layer}"
        m.save_pretrained(out_dir)
        base = tiny_model(kind)
        loaded = peft.PeftModel.from_pretrained(base, out_dir)
        _, loaded_experts = experts_of(loaded, layer)
        with torch.no_grad():
            theirs = loaded_experts(x, ids, w)
        err = rel(mine_out, theirs)
        print(f"{where}: PEFT on the saved adapter {err:.2e}")
        expect(err <= 1e-2, f"{where}: PEFT's output on the module's saved adapter differs by {err:.2e}")
    expect(moe_layers == (1 if kind in ("deepseek_v3", "glm4_moe", "ernie4_5_moe") else 2), f"{kind}: {moe_layers} MoE layers found")


with tempfile.TemporaryDirectory() as tmp:
    for kind in ("qwen3_moe", "qwen2_moe", "deepseek_v3", "glm4_moe", "mixtral", "olmoe", "ernie4_5_moe", "hunyuan_v1_moe", "granitemoe",
                 "deepseek_v4", "gpt_oss"):
        try:
            run(kind, tmp)
        except Exception as e:  # a failure of this test, named, not a crash of the others
            import traceback
            traceback.print_exc()
            expect(False, f"{kind}: {type(e).__name__}: {e}")

finish("the stacked forms agree with transformers v5 + PEFT")
